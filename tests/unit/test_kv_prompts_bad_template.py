"""A model directory whose chat_template.jinja does not compile: the
router routes chat on the predicted index instead of raising from every health check (the exception
skipped `apply()`: a worker that went down was never marked healthy again, and nothing was logged)."""

from __future__ import annotations

import os
from pathlib import Path

from infer_ctl.router.kvindex.kv_prompts import view_for
from tests.engine import tiny_model


def test_a_template_that_does_not_compile_is_no_template(tmp_path: Path) -> None:
    d = tiny_model.write(str(tmp_path / "m"), template_file=True)
    Path(d, "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    view, name = view_for({}, d)
    assert view is not None and name.endswith("(no chat template)")
    assert view.render([{"role": "user", "content": "hi"}]) is None


def test_a_directory_named_chat_template_jinja_is_ignored(tmp_path: Path) -> None:
    d = tiny_model.write(str(tmp_path / "m"), template_file=True)
    os.remove(os.path.join(d, "chat_template.jinja"))
    os.mkdir(os.path.join(d, "chat_template.jinja"))
    view, name = view_for({}, d)
    assert view is not None and name.endswith("(no chat template)")
