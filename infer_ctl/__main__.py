from infer_ctl.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
