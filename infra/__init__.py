"""Test and benchmark infrastructure: emulated cluster networks (``infra.netns``).

Not part of the installed ``damptune`` package; import it with the repository root on
``sys.path`` (pytest's ``pythonpath = ["."]`` does that for the tests).
"""
