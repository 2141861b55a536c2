# mypy: ignore-errors
# inferctl node-side wheel installer. Sent on stdin to `<venv>/bin/python - WHEEL...` by the `inferctl`
# provisioning step (infer_ctl/provision/steps/selfinstall.py). Standard library only: the venv is made
# with `--without-pip` (no ensurepip, no network), and the wheels are pure Python, so installing one is
# unpacking it into the venv's site-packages after checking every member against the wheel's RECORD.
import base64
import hashlib
import os
import sys
import sysconfig
import zipfile


def fail(message):
    sys.stderr.write("inferctl wheel install: " + message + "\n")
    sys.exit(1)


def install(path, target):
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            fail(path + ": no single .dist-info/RECORD")
        expected = {}
        for line in zf.read(records[0]).decode().splitlines():
            name, _, rest = line.partition(",")
            digest = rest.split(",")[0]
            if digest:
                expected[name] = digest
        for name in names:
            if name.startswith("/") or ".." in name.split("/"):
                fail(path + ": unsafe member name " + name)
            if name == records[0] or name.endswith("/"):
                continue
            data = zf.read(name)
            got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if expected.get(name) != got:
                fail(path + ": " + name + " does not match the wheel's RECORD")
        for name in names:
            if name.endswith("/"):
                continue
            dest = os.path.join(target, *name.split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as fh:
                fh.write(zf.read(name))
        with open(os.path.join(target, os.path.dirname(records[0]), "INSTALLER"), "w") as fh:
            fh.write("inferctl\n")


def main():
    if sys.prefix == sys.base_prefix:
        fail("refusing to install outside a venv (run it with <venv>/bin/python)")
    target = sysconfig.get_paths()["purelib"]
    for path in sys.argv[1:]:
        install(path, target)
    print("installed " + str(len(sys.argv) - 1) + " wheel(s) into " + target)


main()
