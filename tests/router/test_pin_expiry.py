

def test_a_superseded_pin_is_no_longer_touched() -> None:
    from infer_ctl.core.routing.policy import WorkerView
    from infer_ctl.core.routing.prefixes import PrefixRegistry

    w = [WorkerView("http://p0:1")]
    reg = PrefixRegistry(rewarm_idle_s=100, pin_touch_s=2)
    reg.register("sys", "A" * 400, now=0, pin=True)
    for action in reg.plan_warmups(w, 0):
        reg.warm_done(action, True, 0)
    reg.register("sys", "B" * 400, now=1, pin=True)  # a new text: v1 superseded
    for action in reg.plan_warmups(w, 1):
        assert action.version == 2
        reg.warm_done(action, True, 1)
    touched = [(a.name, a.version) for t in (3.5, 6, 9) for a in reg.plan_warmups(w, t)
               if not reg.warm_done(a, True, t)]
    assert touched and {v for _, v in touched} == {2}  # the new version is touched, the old one never
