"""Settling an answer below the HTTP edge: check, policy's one decision, carry it out, audit; the queue of checks
run later and its consumer; the checks of a stream checked as it flows. Asked through one object, `settle.guard.Guard`
(started by `settle.guard.start`), with the values of `settle.values`."""
