-- 018: a phased run's history, its sweep's backoff, and giving it up.
--
-- sweep_after: when the recovery sweep may next take the run over; a
-- failed phase pushes it out, doubling with each take, so a run whose
-- provider is down is not taken again and again. A client's retry does
-- not wait for it.
-- last_error_at: when last_error (the last failure of one of the run's
-- phases) was written. Both are kept after the run completes, with flow,
-- run_id and taken, so that a completed key says how it got there.
-- given_up_at, give_up_reason: the run was given up (taken more times than
-- its flow's MaxTakes, or by Phased.GiveUp), and why; its key is complete,
-- with the response the flow's GiveUp chose.
ALTER TABLE {{schema}}.idempotency_keys
    ADD COLUMN sweep_after timestamptz,
    ADD COLUMN last_error_at timestamptz,
    ADD COLUMN given_up_at timestamptz,
    ADD COLUMN give_up_reason text;
