"""The lease lifecycle: every transition of an attempt, and the only module that settles one.

The rule book. A task's row is owned, between its claim and its settlement, by whoever holds
its lease token; every write below is fenced on that token, so a worker that lost its lease
(it lapsed, an operator's cancel was settled, another worker took the row over) writes
nothing, and is told so (`lost`).

- claimed: the claim statement stamps a random token (drawn by the server), burns an attempt
  and sets lease_expires_at = now() + ceiling + margin (repository, sql `claim`). The slot
  puts the lease in its ledger before it tells anyone, so a death from then on is settled by
  the supervisor (`handed_over`), never left to wait out the lease.
- batched (#43): when the backlog is deep and handlers are short, a slot claims several
  tasks in one statement (sql `claim_many`, riding on the settlement of the last batch's
  successes: `dequeue_many_claim_many`), and settles several plain successes in one
  statement, while every task keeps its own lease: its own random token (128 bits each from
  the OS's strong source, drawn by the slot so that a lost answer can be asked about,
  `held_leases`), its own lease stamp and the deadline derived from it, and every
  settlement fenced on each task's own token (a refused one is settled alone, as any
  refused plain success). Why: one statement and one commit per task was the floor
  (tests/bench/RESULTS.md); a batch of n pays one for n. What may be batched: a claim takes
  only types with no concurrency limit, rate or shared limit (`within_limits`,
  `within_rates`, `within_shared` count the leases a statement can see, and rows leased by
  the same statement are not among them) and no fair turns (a fair claim stamps its group's
  turn, #39); those are claimed one per statement as before; a settlement holds only plain
  successes (no dependants, no batch, no stored result or history: `deferrable`);
  everything else (failures, cancels, snoozes, linked and kept successes) is settled alone,
  at once. The claim checks {claimable} per row as the single claim does, so pauses,
  expiry, waits and steps (returned with each claim) hold unchanged. How many (measured,
  slotd/slot/batching.py): n = min(20, the candidates in hand, 50 ms / the slot's average
  attempt), so the last task of a batch waits about 50 ms for the ones before it; below
  two, one claim per statement as before (at low load a wake claims one task). Bounds on
  the waits: a prefetched task not started within 1 s of its claim (a quarter of its
  ceiling if less) is released unstarted, its attempt given back, due at once for any slot
  (a prefetched task never starts late in its lease, so its deadline is its ceiling, less
  that second at most); a held success waits at most 50 ms for its statement, also while
  another attempt runs. The ledger holds the batch (`claimed_many`, `started`, `deferred`;
  slotd/slot/ledger.py): a slot that dies holding one is settled at once by its supervisor
  (`handed_over`, by `batched_words`): each held success dequeued (never run again), each
  prefetched task released with its attempt given back, the running one as for any death.
  A stop (SIGTERM) gives the batch back at once, while the running attempt has its
  shutdown grace: prefetched tasks released unstarted (`released_unstarted`), held
  successes settled.
- advanced: a sliced handler's cursor (sql `advance_cursor`) rewrites the payload and resets
  the attempt count, fenced on the token, and KEEPS the lease. The seed unleased the row at
  the advance, because its worker could die unseen between the advance and the return; a
  slotd slot's death is settled by its supervisor at once, so that reason is gone, and
  keeping the lease means the handler's return settles its own slice: done dequeues it (a
  release at the advance made that `lost`, and the task ran again for ever), raising backs
  it off from the saved cursor (a release made that a retry storm with no error kept), and
  no other slot can start the next slice while this one still runs its remaining code.
- stepped: a durable step's JSON value (ctx.step, #38) is appended to the task's steps (sql
  `record_step`), fenced on the token, refused once the task is cancelled, and KEEPS the
  lease; the handler goes on only after the write is acknowledged, so a step whose value
  was stored is never run again by this task (the claim hands the stored steps to every
  later attempt), and one whose write was refused raises LeaseLost in the handler's frame.
  The attempt count is left alone: a step is progress inside an attempt, not a slice.
  Idempotent by its place in the run, so a retry after a lost answer stores it once.
- suspended: a durable sleep or event wait (ctx.sleep, ctx.wait_event, #38) is one fenced
  statement (sql `wait_step`, after the event's advisory lock in its own statement, as
  slotd_emit takes it): an event already emitted (kept for SLOTD_RETENTION) or a wake time
  come is stored as the step's value and the attempt goes on; else the wait is registered,
  the lease released, the task due at its wake time (or 'infinity' until its emit), and the
  attempt its claim burnt given back (waiting is not an attempt). Looking and registering
  in one statement under the lock is why no emit is ever missed. The attempt then ends
  with nothing left to write (`settle`: outcome suspended).
- settled, by what the handler did (`settle`):
  done       the row is deleted (`succeeded.plain`: statements composed from parts,
             slotd/repository/composed.py), optionally claiming the next task in the
             same statement (`succeeded.plain+claim.plain`); for a type with keep_result
             (the Result carries value and keep_s) the return value is stored by that same
             fenced statement (part `kept`), so a worker whose lease is
             gone stores nothing, and a dead slot's success is stored by the supervisor
             from the value in its last words. Plain types keep the plain statements: a
             stored result costs its types only;
             a linked task (one with dependants, marked by their enqueue, or of a batch)
             is settled by part `linked` (with the next claim riding on it, as for a
             plain task; a batch's member with nothing else linked, by part `member`):
             the same fenced delete also writes its value
             on each edge and makes due each dependant it was the last parent of, so a
             dependant is released exactly when its last parent's success commits, and
             counts the end in its batch (`batch_counted`), whose last end enqueues the
             batch's callback in that same statement: exactly once, since only the
             statement that empties the batch's last stripe does it, and a fenced write
             that matched nothing counts nothing. The plain statements refuse a linked row
             ({unlinked}): a dependant enqueued while its parent ran, after the claim said
             "no dependants", is then settled by the linked statement on a second try,
             never deleted unseen;
  failure    backoff from the attempt the claim burnt, the error kept (`failed.plain`);
             a dead letter when that was the last attempt; a linked task's dead letter
             cancels its dependants, transitively, in the same statement, and counts
             every task that ended so in its batch (`failed.linked`; refused plain
             writes retried so, as for done). Every other statement that ends a task
             counts it as well: `release` when it makes the dead letter (and cancels the
             dependants), `cancel` of a task not running, `settle_cancelled`, and the
             cascades of a cancel (`cancel_dependants`). `dead retry` takes a task out of
             its batch: the batch counted its end already;
  timeout    the same write, for a handler past its deadline or killed by the watchdog;
  crashed    the same write, for a runner that died under the handler;
  discarded  a typed handler's payload its model refused (slotd.typed.models): the same write with
             `discard`, which makes the dead letter now (dead_reason 'discarded', the
             threshold lowered to the attempts run), since the same payload would fail every
             attempt; dependants are cancelled and a batch counts it 'failed', as for any
             failure's dead letter;
  discarded  also a handler's own word (#38): `raise slotd.Discard(reason)`, an exception its
             handler's `discard_on` names, or one its `retry_on` does not (decided in the
             runner, slotd/runner/decisions.py, carried as Result.extra[DISCARD]);
  retry after a failure whose delay the handler chose (`raise slotd.RetryAfter(td)`, its
             `backoff=`): the failure's write with that delay as base and cap and no
             jitter, so the next attempt is due then; still bounded by max_attempts;
  snoozed    `raise slotd.Snooze(td)`: the lease goes, due again after td, and the attempt
             the claim burnt is given back (sql `snooze`): a snooze is the handler saying
             "not yet", never a step towards the dead letter, so a task of max_attempts 2
             may snooze many times and still get both its attempts. Counted on the row
             (sql/071) and capped (MAX_SNOOZES): past the cap the same write as discarded,
             its error saying so, since a handler that snoozes for ever must still end.
             Refused for a cancelled task: settled as the cancel. A snooze past the task's
             expires_at lets it expire (the claim refuses it from then; the sweep ends it);
  continued  a slice that returned False: released and due at once after an advance
             (`continue_slice`), backed off like a failure when it saved nothing (it would
             repeat itself at once);
  cancelled  an operator's cancel: the lease goes, the row stays the dead letter the cancel
             made it (`settle_cancelled`); or a shutdown: the lease is released (`release`);
  lost       any fenced write that matched nothing: nothing is written.
- released: at shutdown the lease is given back at once (sql `release`), due for another
  replica. The attempt is not refunded (an interruption costs one, or a task always
  mid-flight at rollout would never dead-letter), except the final one, once per task: a
  deploy is never what kills a task; a second release on a final attempt dead-letters it.
  A claim released before its handler started (it met the shutdown on its way in) gets its
  attempt back whatever it was: nothing ran, so nothing was interrupted.
- dead letters: the statement that makes a row dead writes why (dead_reason: 'exhausted' by
  the last attempt's failure or a second final release, 'cancelled' by an operator; sql/021)
  and the attempts it really ran (dead_attempts). Being dead is still attempt_count >=
  max_attempts in this release, so a cancel raises the count to the threshold as 0.1.0 did
  (its replicas claim by that comparison); readers show dead_attempts, never the raise. A
  row made dead by a 0.1.0 replica carries no reason: readers infer 'exhausted' (or
  'cancelled' from its cancel stamp). `slotd dead retry` clears both.
- lapsed: a final attempt whose lease ran out with nobody left to settle it (its whole
  replica died: a slot's death alone is handed over, below) is dead by the predicate from
  that instant, but nothing wrote its end, so its dependants would wait and its batch
  never call back. The lapse sweep (`sweep`) writes it: the lease cleared, dead_reason
  'exhausted' (a cancelled attempt keeps 'cancelled'), the attempts it ran, an error naming
  the lapse, its dependants cancelled and its batch counted (sql `lapsed`), in one
  statement. It runs when a heartbeat has seen a final attempt's lease lapse (the
  heartbeat's statement reads the soonest one, sql `replica_heartbeat`), so at most once a
  heartbeat interval and never while none has lapsed: reading the leases costs (behind a
  held xmin the leases' index keeps an entry for every task finished since, 50 ms a pass at
  100k), while a lapse has waited ceiling + margin already and 30 s more changes nothing
  for it. Counted as outcome `crashed` (`cancelled` for a cancelled
  attempt) by the replica whose sweep settled it. A holder still alive past its lease has
  lost it already (it retries a settlement only while its lease lasts): the sweep clears
  the token its late write is fenced on, and that write is `lost`.
  An attempt with attempts left whose lease lapsed is not swept: its row is claimable again
  at once (the seed's rule), and the claim that takes it over remembers the lapsed attempt
  (slotd_attempts: `crashed`, no worker, ended at the lapse, sql `lapse_remembered`), in
  the claimer's next statement, fenced on its new lease so exactly one claim records it.
  The claim reads the old lease under its row lock (fragment `lapsed_lease`) and names no
  other table: a plain claim's plan and cost are unchanged. A claim whose answer was lost
  (found again by held_lease) cannot record it: that lapse goes unremembered.
- sequences (#39, sql/080): a member of a sequence runs only as its head; its settlement
  (always a linked one: every member is marked has_dependants) first takes the sequence's
  row lock in a statement of its own (sql `sequence_lock_task`), so its snapshot sees every
  member whose enqueue committed before, then moves the sequence on in the same statement
  as its end (`sequence_moved`): the next member due, unless the end is a failure that
  halts the sequence (the handler's sequence_on_failure, "halt" by default). A retry is
  not an end: it holds the rest. A cancel of a running head moves it on only when its slot
  settles the cancel, so two members never run at once.
- expired: a task enqueued with expires_in is never started after its expires_at: the
  claim's claimable predicate refuses it from that instant, by the database's clock, so no
  sweep has to be on time for the rule to hold. The expiry sweep (`expire`, on a
  replica's chores thread when the soonest expiry its slots' discoveries saw has come, all
  types, a batch per statement; slotd/supervisor/sweep_timer.py) then makes
  each such task no lease holds a dead letter (dead_reason 'expired', sql `expire`), so it
  leaves the discovery index instead of being passed over at every discovery, and
  slotd.result answers "expired". A running attempt has started and is left to end; if it
  fails, its retry would start after expires_at, so the next sweep expires it instead (a
  stale e-mail is as stale on its second attempt). Counted as outcome `expired` by the
  replica whose sweep made it.
- handed over: a slot that dies holding a lease leaves it, with its last words (the
  attempt's outcome if the handler had ended), in its ledger; the supervisor settles it by
  those words, through the same `settle`, on its chores thread (`handed_over`).

- answer lost: a connection that drops after a settlement's statement was sent leaves its
  answer unread; the slot reconnects and retries while its lease lasts. A success's retry
  first asks what the first try did, since its write would now be refused and the success
  counted `lost`: the claim that rode on it is found under the token the slot chose for it
  (`held_lease`), and a row that is gone was dequeued by it, since only the holder of a live
  lease removes a live row (`lease_remains`). A chained claim that found no next task is
  the common case, at the end of a backlog. A failure's retry cannot tell (its row stays)
  and is counted `lost` at worst: the row holds what the first try wrote.

Order, for the slot: the last words go into the ledger before the database is written (a
death mid-write is settled by what the handler did, never as a crash that would run a
success again); the database; then the ledger (the settlement counted, the lease dropped or
replaced by the claim that rode on the settlement) and the log line. A refused write
(LeaseLost) is always `lost`; a write the database refuses for the data's sake is recorded
as the attempt's failure with the reason (`_unsettled`); a lost connection is the caller's
to retry while the lease lasts.

Where each rule is carried out. This package is the one place that settles a task; it is a
package, not one module, so that the rule book above stays whole at its door while the code
that carries it out is read room by room (every name is imported from here: callers write
`lifecycle.settle`, `lifecycle.conclude`, ...):
- by_outcome.py: `settle`, the settlement by what the handler did ("settled", "released"),
  and the results of a claim that never started (`not_started`, `not_started_at_shutdown`);
- holder.py: the slot's transitions, `claimed`, `advance`, `step`, and `conclude` with the retries
  of a settlement whose answer was lost ("answer lost", "Order");
- handover.py: `handed_over`, a dead slot's lease settled by its supervisor ("handed over");
- batched.py: a slot's batch, `claimed_many`, `started`, `deferred`, `conclude_many`,
  `released_unstarted`, `batched_words` ("batched");
- sweeps.py: `expire`, `lapse` and `sweep` ("expired", "lapsed");
- settlement.py: the `Settlement` every one of them returns, and its log line."""

from slotd.lifecycle.batched import (
    batched_words,
    claimed_many,
    conclude_many,
    deferrable,
    deferred,
    released_unstarted,
    started,
    unstarted,
)
from slotd.lifecycle.by_outcome import (
    DISCARD,
    MAX_SNOOZES,
    NOT_ADVANCED,
    UNSTARTED,
    not_started,
    not_started_at_shutdown,
    settle,
)
from slotd.lifecycle.handover import handed_over
from slotd.lifecycle.holder import advance, claimed, conclude, step, wait
from slotd.lifecycle.settlement import Logger, Settlement, Writer
from slotd.lifecycle.sweeps import EXPIRE_BATCH, EXPIRE_ROUNDS, Swept, expire, lapse, sweep

__all__ = [
    "DISCARD",
    "EXPIRE_BATCH",
    "EXPIRE_ROUNDS",
    "MAX_SNOOZES",
    "NOT_ADVANCED",
    "UNSTARTED",
    "Logger",
    "Settlement",
    "Swept",
    "Writer",
    "advance",
    "batched_words",
    "claimed_many",
    "conclude_many",
    "deferrable",
    "deferred",
    "released_unstarted",
    "started",
    "unstarted",
    "claimed",
    "conclude",
    "expire",
    "handed_over",
    "lapse",
    "not_started",
    "not_started_at_shutdown",
    "settle",
    "step",
    "sweep",
    "wait",
]
