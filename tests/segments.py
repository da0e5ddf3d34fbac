"""Faults placed inside a training segment of the engine's driver, however short the training:
after the ranks' tasks were submitted, before their results are awaited."""

from damptune.segments import SegmentRunner


def act_inside_a_segment(monkeypatch, armed, act):
    """Run ``act()`` once, in the driver's thread, inside the first training segment for which
    ``armed()`` is true (a spy on ``SegmentRunner._wait``)."""
    real_wait, done = SegmentRunner._wait, []

    def wait(self, futures, what, **kw):
        if what == "training segment" and not done and armed():
            done.append(True)
            act()
        return real_wait(self, futures, what, **kw)

    monkeypatch.setattr(SegmentRunner, "_wait", wait)
