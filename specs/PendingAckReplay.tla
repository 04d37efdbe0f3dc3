-------------------------- MODULE PendingAckReplay --------------------------
(***************************************************************************)
(* Replay of a transaction pending-ack log (Pulsar's MLPendingAckStore     *)
(* replay; pulsar-core src/pending_ack) before a subscription with        *)
(* transactional acks may serve: the replay thread's loop and fill_queue, *)
(* read completions and failures delivered by another thread, the         *)
(* end-of-attempt rules (rewind on failure), and the handle's retry on a  *)
(* timer. It protects: no read after a failure, Ready only when every     *)
(* durable record was applied, and a handle that always settles.          *)
(*                                                                         *)
(* The log holds entries 1..N. The cursor's read position rp is the next  *)
(* entry a read returns; its mark-delete is fixed at 0 (no trimming), so  *)
(* rewind sets rp to 1. The handle's applied set survives attempts.        *)
(*                                                                         *)
(* fill_queue's two loads (outstanding counter, is_readable flag) and      *)
(* read_failed's three stores (failure slot, flag, counter) are separate   *)
(* steps, so their order matters. Bug switches (negative controls):        *)
(*   ReaderReversed - fill_queue loads is_readable before the counter;     *)
(*   WriterReversed - read_failed decrements before clearing the flag;     *)
(*   NoRewind       - a failed attempt does not rewind the cursor;         *)
(*   SpinOnFailure  - an unclassified failure only                          *)
(*                    decrements the counter (liveness bug: hot loop);     *)
(*   StaleDrain     - the "queue drained" check uses the queue length      *)
(*                    sampled BEFORE the counter load (a read completing   *)
(*                    in between is missed: the drained check must be      *)
(*                    fresh, after the outstanding-reads load).            *)
(*                                                                         *)
(* Extensions (what a replay must survive: a moved read position, a lost *)
(* read callback, a closed cursor):                                        *)
(*   - the cached cursor's read position at attempt start may be anywhere *)
(*     (MovedStart); every attempt rewinds it to the entry after the      *)
(*     mark-delete, and a replay that runs dry short of the snapshot is   *)
(*     failed ("incomplete"), never Ready;                                *)
(*   - a read callback may be lost (MaxLost) and come back late; the      *)
(*     handle is then closed, which interrupts the attempt; the attempt   *)
(*     ends without waiting for the lost read, a late read of a stopped   *)
(*     attempt reads nothing (read gate), and a re-subscribe on the same  *)
(*     executor replays again;                                            *)
(*   - the cursor may be closed between attempts (CloseCursorAtInit); the *)
(*     next attempt reopens it through the managed ledger if it can       *)
(*     (canReopen), else the handle gives up after MaxReopen attempts.    *)
(* More bug switches: NoStartRewind, NoDrainCheck (moved read position), *)
(*   WaitForOutstanding (lost callback: a wait for outstanding reads),    *)
(*   NoReadGate (a late read still moves the cursor), NoReopen (closed    *)
(*   cursor:                                                               *)
(*   a closed cursor retried forever).                                    *)
(*                                                                         *)
(* Failures are bounded: at most MaxTransient transient ones, at most one  *)
(* completing shape (fenced / cursor closed); if the ledger is lost every  *)
(* read fails non-recoverably (completing only with auto-skip on). A log   *)
(* that is not lost may still fail up to MaxNonrec single reads            *)
(* non-recoverably (the storage reports that read's data missing).         *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS N,              \* entries in the pending-ack log
          B,              \* entries per read
          Cap,            \* entry-queue capacity
          MaxTransient,   \* transient read failures the environment may inject
          MaxNonrec,      \* single non-recoverable read failures of a log not lost
          ReaderReversed, \* BOOLEAN bug switch
          WriterReversed, \* BOOLEAN bug switch
          NoRewind,       \* BOOLEAN bug switch
          SpinOnFailure,  \* BOOLEAN bug switch
          StaleDrain,     \* BOOLEAN bug switch
          MovedStart,     \* BOOLEAN: the cached cursor's read position may start anywhere
          MaxLost,        \* read callbacks the environment may lose (then late)
          CloseCursorAtInit, \* BOOLEAN: the cursor may be closed between attempts
          MaxReopen,      \* attempts that may fail to reopen a closed cursor
          NoStartRewind,  \* BOOLEAN bug switch (moved read position)
          NoDrainCheck,   \* BOOLEAN bug switch (moved read position)
          WaitForOutstanding, \* BOOLEAN bug switch (lost read callback)
          NoReadGate,     \* BOOLEAN bug switch (late read callback)
          NoReopen        \* BOOLEAN bug switch (closed cursor)

VARIABLES
    lost, autoSkip,        \* environment: ledger data lost? auto-skip on?
    rp,                    \* cursor read position (next entry read)
    applied,               \* entries applied to the handle state
    hstate, timerArmed,    \* handle state, retry timer pending
    transLeft, compLeft,   \* remaining failure budget
    att,                   \* current attempt number
    rpc,                   \* replay thread program counter
    cur,                   \* current_load_position
    queue,                 \* entry queue
    outstanding,           \* outstanding read counter
    readable,              \* is_readable flag
    failure,               \* stored attempt failure: "none" | kind
    completing,            \* a completing failure ended this attempt
    stopped,               \* stop_replay ran
    caughtUp,              \* the loop reached the snapshot N
    failedSeen,            \* a read of this attempt failed (W1 happened)
    readsAfterFail,        \* reads issued after failedSeen (capped)
    reads,                 \* reads issued in this attempt (capped)
    fromRewound,           \* the current attempt started at rp = 1
    outcome,               \* "none" | "complete" | "failed"
    readyPartial,          \* Ready after a completing failure
    reported,              \* set of <<attempt, outcome>> reported
    reqs,                  \* issued reads not yet picked up (attempt ids)
    envpc, envAtt,         \* read-callback thread pc and its read's attempt
    qsnap,                 \* queue length sampled by fill_queue's room check
    interrupted,           \* the handle's close interrupted the attempt
    lostCb,                \* a read callback of this handle was lost
    lostLeft, late,        \* loss budget; lost reads that may come back late
    nonrecLeft,            \* single non-recoverable failures left (log not lost)
    cursorClosed, closeLeft, canReopen, \* closed cursor, budget, reopen possible
    reopenFails,           \* attempts in a row that could not reopen
    resubLeft,             \* re-subscribes (new handle, same executor) left
    lateMoved              \* a late read of a stopped attempt moved the cursor

vars == <<lost, autoSkip, rp, applied, hstate, timerArmed, transLeft,
          compLeft, att, rpc, cur, queue, outstanding, readable, failure,
          completing, stopped, caughtUp, failedSeen, readsAfterFail, reads,
          fromRewound, outcome, readyPartial, reported, reqs, envpc, envAtt,
          qsnap, interrupted, lostCb, lostLeft, late, cursorClosed, closeLeft,
          canReopen, reopenFails, resubLeft, lateMoved, nonrecLeft>>

(* The extension's variables, grouped for UNCHANGED. *)
extEnv == <<lostLeft, late, closeLeft, canReopen, lateMoved, nonrecLeft>>
extHandle == <<interrupted, lostCb, cursorClosed, reopenFails, resubLeft>>

Min(a, b) == IF a < b THEN a ELSE b
Cap3(x) == Min(x, 3)
Range(a, b) == [i \in 1..(b - a + 1) |-> a + i - 1]
Kinds == {"transient", "nonrec", "completing"}

attemptVars == <<cur, queue, outstanding, readable, failure, completing,
                 stopped, caughtUp, failedSeen, readsAfterFail, reads,
                 fromRewound, outcome>>

Init ==
    /\ lost \in BOOLEAN
    /\ autoSkip \in BOOLEAN
    /\ rp \in (IF MovedStart THEN 1..(N + 1) ELSE {1})
    /\ applied = {}
    /\ hstate = "Init"
    /\ timerArmed = FALSE
    /\ transLeft = MaxTransient
    /\ compLeft = 1
    /\ att = 0
    /\ rpc = "idle"
    /\ cur = 0
    /\ queue = <<>>
    /\ outstanding = 0
    /\ readable = TRUE
    /\ failure = "none"
    /\ completing = FALSE
    /\ stopped = FALSE
    /\ caughtUp = FALSE
    /\ failedSeen = FALSE
    /\ readsAfterFail = 0
    /\ reads = 0
    /\ fromRewound = TRUE
    /\ outcome = "none"
    /\ readyPartial = FALSE
    /\ reported = {}
    /\ reqs = <<>>
    /\ envpc = "idle"
    /\ envAtt = 0
    /\ qsnap = 0
    /\ interrupted = FALSE
    /\ lostCb = FALSE
    /\ lostLeft = MaxLost
    /\ nonrecLeft = MaxNonrec
    /\ late = <<>>
    /\ cursorClosed = FALSE
    /\ closeLeft = (IF CloseCursorAtInit THEN 1 ELSE 0)
    /\ canReopen \in BOOLEAN
    /\ reopenFails = 0
    /\ resubLeft = 1
    /\ lateMoved = FALSE

-----------------------------------------------------------------------------
(* Replay thread. *)

envVars == <<reqs, envpc, envAtt, lost, autoSkip, transLeft, compLeft, qsnap>>
handleVars == <<hstate, timerArmed, att, readyPartial>>

(* Loop head: interrupted (the handle closed), caught up to the        *)
(* snapshot, or go fill the queue.                                     *)
RLoop ==
    /\ rpc = "loop"
    /\ IF interrupted
          THEN /\ rpc' = "end"
               /\ failure' = (IF failure = "none" THEN "interrupted" ELSE failure)
               /\ UNCHANGED caughtUp
          ELSE IF cur >= N
          THEN /\ rpc' = "end"
               /\ caughtUp' = TRUE
               /\ UNCHANGED failure
          ELSE /\ rpc' = "fq_room"
               /\ UNCHANGED <<caughtUp, failure>>
    /\ UNCHANGED <<rp, applied, cur, queue, outstanding, readable,
                   completing, stopped, failedSeen, readsAfterFail, reads,
                   fromRewound, outcome, reported>>
    /\ UNCHANGED envVars
    /\ UNCHANGED handleVars
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* fill_queue: room for a batch? Then R1 (counter) and R2 (flag). *)
FqRoom ==
    /\ rpc = "fq_room"
    /\ qsnap' = Len(queue)
    /\ rpc' = (IF Len(queue) + B < Cap
                  THEN (IF ReaderReversed THEN "fq_flag" ELSE "fq_count")
                  ELSE "fq_ret")

(* R1: load the outstanding-read counter. *)
FqCount ==
    /\ rpc = "fq_count"
    /\ UNCHANGED qsnap
    /\ rpc' = (IF outstanding = 0
                  THEN (IF ReaderReversed THEN "fq_issue" ELSE "fq_flag")
                  ELSE "fq_ret")

(* R2: load is_readable. *)
FqFlag ==
    /\ rpc = "fq_flag"
    /\ UNCHANGED qsnap
    /\ rpc' = (IF readable
                  THEN (IF ReaderReversed THEN "fq_count" ELSE "fq_issue")
                  ELSE "fq_ret")

FqPcOnly ==
    /\ \/ FqRoom
       \/ FqCount
       \/ FqFlag
    /\ UNCHANGED <<rp, applied, attemptVars, reported>>
    /\ UNCHANGED <<reqs, envpc, envAtt, lost, autoSkip, transLeft, compLeft>>
    /\ UNCHANGED handleVars
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* The queue length the drained check uses: fresh, or (bug) the sample. *)
DrainLen == IF StaleDrain THEN qsnap ELSE Len(queue)

(* Issue a read if the cursor has more entries; else, with an empty     *)
(* queue, nothing is readable any more.                                 *)
FqIssue ==
    /\ rpc = "fq_issue"
    /\ IF rp <= N
          THEN /\ outstanding' = outstanding + 1
               /\ reqs' = Append(reqs, att)
               /\ reads' = Cap3(reads + 1)
               /\ readsAfterFail' = (IF failedSeen
                                        THEN Cap3(readsAfterFail + 1)
                                        ELSE readsAfterFail)
               /\ UNCHANGED readable
          ELSE /\ readable' = (IF DrainLen = 0 THEN FALSE ELSE readable)
               /\ UNCHANGED <<outstanding, reqs, reads, readsAfterFail>>
    /\ rpc' = "fq_ret"
    /\ UNCHANGED <<rp, applied, cur, queue, failure, completing, stopped,
                   caughtUp, failedSeen, fromRewound, outcome, reported>>
    /\ UNCHANGED <<envpc, envAtt, lost, autoSkip, transLeft, compLeft, qsnap>>
    /\ UNCHANGED handleVars
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* fill_queue returns is_readable; false ends the loop. *)
FqRet ==
    /\ rpc = "fq_ret"
    /\ rpc' = (IF readable THEN "poll" ELSE "end")
    /\ UNCHANGED <<rp, applied, attemptVars, reported>>
    /\ UNCHANGED envVars
    /\ UNCHANGED handleVars
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* Apply the head of the queue, or (empty) wait and loop again. *)
Poll ==
    /\ rpc = "poll"
    /\ IF Len(queue) > 0
          THEN /\ applied' = applied \cup {Head(queue)}
               /\ cur' = Head(queue)
               /\ queue' = Tail(queue)
          ELSE UNCHANGED <<applied, cur, queue>>
    /\ rpc' = "loop"
    /\ UNCHANGED <<rp, outstanding, readable, failure, completing, stopped,
                   caughtUp, failedSeen, readsAfterFail, reads, fromRewound,
                   outcome, reported>>
    /\ UNCHANGED envVars
    /\ UNCHANGED handleVars
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* End of attempt: stop_replay releases the queue (and, through the     *)
(* read gate, makes any later read of this attempt read nothing). A     *)
(* replay that ran dry short of the snapshot with no failure that       *)
(* explains it is failed as "incomplete" (never Ready). A stored        *)
(* failure before catching up fails the attempt and rewinds             *)
(* (rp := next(mark-delete) = 1) WITHOUT waiting for an outstanding     *)
(* read (its callback may be lost); otherwise the replay completes.     *)
Short == ~caughtUp /\ failure = "none" /\ ~completing /\ ~NoDrainCheck
EndFailure == IF Short THEN "incomplete" ELSE failure

REnd ==
    /\ rpc = "end"
    /\ stopped' = TRUE
    /\ queue' = <<>>
    /\ failure' = EndFailure
    /\ IF EndFailure # "none" /\ ~caughtUp
          THEN /\ (WaitForOutstanding => outstanding = 0)
               /\ rp' = (IF NoRewind THEN rp ELSE 1)
               /\ outcome' = "failed"
               /\ reported' = reported \cup {<<att, "failed">>}
          ELSE /\ outcome' = "complete"
               /\ reported' = reported \cup {<<att, "complete">>}
               /\ UNCHANGED rp
    /\ rpc' = "done"
    /\ UNCHANGED <<applied, cur, outstanding, readable, completing,
                   caughtUp, failedSeen, readsAfterFail, reads, fromRewound>>
    /\ UNCHANGED envVars
    /\ UNCHANGED handleVars
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* WaitForOutstanding (bug): the failed attempt's wait for outstanding  *)
(* reads, a loop of timed waits on the replay thread (a stutter).       *)
QuiesceWait ==
    /\ rpc = "end"
    /\ WaitForOutstanding
    /\ EndFailure # "none" /\ ~caughtUp
    /\ outstanding # 0
    /\ UNCHANGED vars

ReplayStep == RLoop \/ FqPcOnly \/ FqIssue \/ FqRet \/ Poll \/ REnd \/ QuiesceWait

-----------------------------------------------------------------------------
(* Read-callback thread (managed-ledger executor, or the replay thread  *)
(* itself for a synchronous failure): picks up an issued read, performs *)
(* it, then runs read_complete or read_failed step by step.             *)

EnvTake ==
    /\ envpc = "idle"
    /\ reqs # <<>>
    /\ envAtt' = Head(reqs)
    /\ reqs' = Tail(reqs)
    /\ envpc' = "read"
    /\ UNCHANGED <<lost, autoSkip, rp, applied, hstate, timerArmed, transLeft,
                   compLeft, att, rpc, attemptVars, readyPartial, reported, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

Live == envAtt = att /\ ~stopped

(* Success: the ML moves rp past the entries, then the callback enqueues *)
(* them; one step, as ReadJob::run holds the read gate across both. A    *)
(* read of an attempt that already stopped reads nothing (the gate);     *)
(* with NoReadGate it still moves the shared cursor.                     *)
ReadOk ==
    /\ envpc = "read"
    /\ ~lost
    /\ IF rp <= N /\ (Live \/ NoReadGate)
          THEN LET last == Min(rp + B - 1, N) IN
               /\ rp' = last + 1
               /\ queue' = (IF Live THEN queue \o Range(rp, last) ELSE queue)
               /\ lateMoved' = (lateMoved \/ ~Live)
          ELSE UNCHANGED <<rp, queue, lateMoved>>
    /\ envpc' = "dec"
    /\ UNCHANGED <<lost, autoSkip, applied, hstate, timerArmed, transLeft,
                   compLeft, att, rpc, cur, outstanding, readable, failure,
                   completing, stopped, caughtUp, failedSeen, readsAfterFail,
                   reads, fromRewound, outcome, readyPartial, reported, reqs,
                   envAtt, qsnap>>
    /\ UNCHANGED <<lostLeft, late, closeLeft, canReopen, nonrecLeft>>
    /\ UNCHANGED extHandle

(* The callback of a picked-up read is lost (the storage client drops   *)
(* it): the counter stays incremented; the read may come back late.     *)
EnvLose ==
    /\ envpc = "read"
    /\ lostLeft > 0
    /\ lostLeft' = lostLeft - 1
    /\ late' = Append(late, envAtt)
    /\ lostCb' = TRUE
    /\ envpc' = "idle"
    /\ UNCHANGED <<lost, autoSkip, rp, applied, hstate, timerArmed, transLeft,
                   compLeft, att, rpc, attemptVars, readyPartial, reported,
                   reqs, envAtt, qsnap>>
    /\ UNCHANGED <<closeLeft, canReopen, lateMoved, nonrecLeft>>
    /\ UNCHANGED <<interrupted, cursorClosed, reopenFails, resubLeft>>

(* A lost read comes back only after its attempt ended. *)
EnvLate ==
    /\ envpc = "idle"
    /\ late # <<>>
    /\ (Head(late) # att \/ stopped)
    /\ envAtt' = Head(late)
    /\ late' = Tail(late)
    /\ envpc' = "read"
    /\ UNCHANGED <<lost, autoSkip, rp, applied, hstate, timerArmed, transLeft,
                   compLeft, att, rpc, attemptVars, readyPartial, reported,
                   reqs, qsnap>>
    /\ UNCHANGED <<lostLeft, closeLeft, canReopen, lateMoved, nonrecLeft>>
    /\ UNCHANGED extHandle

(* Someone closes the cached cursor between attempts. *)
CloseCursor ==
    /\ closeLeft > 0
    /\ rpc = "idle"
    /\ closeLeft' = 0
    /\ cursorClosed' = TRUE
    /\ UNCHANGED <<lost, autoSkip, rp, applied, hstate, timerArmed, transLeft,
                   compLeft, att, rpc, attemptVars, readyPartial, reported,
                   reqs, envpc, envAtt, qsnap>>
    /\ UNCHANGED <<lostLeft, late, canReopen, lateMoved, nonrecLeft>>
    /\ UNCHANGED <<interrupted, lostCb, reopenFails, resubLeft>>

Completes(k) == (k = "completing") \/ (k = "nonrec" /\ autoSkip)

(* W1: classify and store the failure (unless it completes the replay). *)
ReadFail(k) ==
    /\ envpc = "read"
    /\ IF lost
          THEN k = "nonrec"
          ELSE \/ (k = "transient" /\ transLeft > 0)
               \/ (k = "completing" /\ compLeft > 0)
               \/ (k = "nonrec" /\ nonrecLeft > 0)
    /\ transLeft' = (IF k = "transient" THEN transLeft - 1 ELSE transLeft)
    /\ compLeft' = (IF k = "completing" THEN compLeft - 1 ELSE compLeft)
    /\ nonrecLeft' = (IF k = "nonrec" /\ ~lost THEN nonrecLeft - 1 ELSE nonrecLeft)
    /\ IF envAtt = att
          THEN /\ failedSeen' = TRUE
               /\ failure' = (IF ~Completes(k) /\ failure = "none" /\ ~SpinOnFailure
                                 THEN k ELSE failure)
               /\ completing' = (completing \/ Completes(k))
          ELSE UNCHANGED <<failedSeen, failure, completing>>
    /\ envpc' = (IF SpinOnFailure /\ ~Completes(k)
                    THEN "w3"
                    ELSE IF WriterReversed THEN "w3first" ELSE "w2")
    /\ UNCHANGED <<lost, autoSkip, rp, applied, hstate, timerArmed, att, rpc,
                   cur, queue, outstanding, readable, stopped, caughtUp,
                   readsAfterFail, reads, fromRewound, outcome, readyPartial,
                   reported, reqs, envAtt, qsnap>>
    /\ UNCHANGED <<lostLeft, late, closeLeft, canReopen, lateMoved>>
    /\ UNCHANGED extHandle

(* W2: clear is_readable.  W3: decrement the counter (last).            *)
(* "dec" is read_complete's decrement, after its enqueue.               *)
EnvFinish ==
    /\ envpc \in {"w2", "w3", "w3first", "w2last", "dec"}
    /\ IF envpc \in {"w2", "w2last"}
          THEN readable' = (IF envAtt = att THEN FALSE ELSE readable)
          ELSE UNCHANGED readable
    /\ IF envpc \in {"w3", "w3first", "dec"}
          THEN outstanding' = (IF envAtt = att THEN outstanding - 1 ELSE outstanding)
          ELSE UNCHANGED outstanding
    /\ envpc' = (CASE envpc = "w2" -> "w3"
                   [] envpc = "w3first" -> "w2last"
                   [] OTHER -> "idle")
    /\ UNCHANGED <<lost, autoSkip, rp, applied, hstate, timerArmed, transLeft,
                   compLeft, att, rpc, cur, queue, failure, completing,
                   stopped, caughtUp, failedSeen, readsAfterFail, reads,
                   fromRewound, outcome, readyPartial, reported, reqs, envAtt, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

EnvStep ==
    \/ EnvTake
    \/ ReadOk
    \/ \E k \in Kinds : ReadFail(k)
    \/ EnvFinish
    \/ EnvLose
    \/ EnvLate
    \/ CloseCursor

-----------------------------------------------------------------------------
(* Handle: start an attempt on the replay executor; classify its end;   *)
(* the retry timer moves None back to Initializing.                      *)

(* A new attempt's reset of the per-attempt variables. *)
FreshAttempt ==
    /\ att' = att + 1
    /\ rpc' = "loop"
    /\ cur' = 0
    /\ queue' = <<>>
    /\ outstanding' = 0
    /\ readable' = TRUE
    /\ failure' = "none"
    /\ completing' = FALSE
    /\ stopped' = FALSE
    /\ caughtUp' = FALSE
    /\ failedSeen' = FALSE
    /\ readsAfterFail' = 0
    /\ reads' = 0
    /\ outcome' = "none"

(* Start an attempt on the (free) replay executor. The cursor is rewound *)
(* to the entry after the mark-delete first (NoStartRewind: not). A      *)
(* closed cursor is reopened through the managed ledger (read position  *)
(* after the mark-delete) if possible; if not, the attempt fails at once *)
(* and the handle gives up after MaxReopen such attempts. NoReopen: the *)
(* faulty handle retries a closed cursor forever.                        *)
HStart ==
    /\ hstate = "Init"
    /\ rpc = "idle"
    /\ IF cursorClosed /\ (NoReopen \/ ~canReopen)
          THEN /\ reopenFails' = (IF NoReopen THEN reopenFails ELSE reopenFails + 1)
               /\ IF ~NoReopen /\ reopenFails + 1 >= MaxReopen
                     THEN /\ hstate' = "Error"
                          /\ UNCHANGED timerArmed
                     ELSE /\ hstate' = "None"
                          /\ timerArmed' = TRUE
               /\ UNCHANGED <<rp, att, rpc, attemptVars, cursorClosed>>
          ELSE /\ FreshAttempt
               /\ LET start == IF cursorClosed \/ ~NoStartRewind THEN 1 ELSE rp IN
                  /\ rp' = start
                  /\ fromRewound' = (start = 1)
               /\ cursorClosed' = FALSE
               /\ reopenFails' = 0
               /\ UNCHANGED <<hstate, timerArmed>>
    /\ UNCHANGED <<lost, autoSkip, applied, transLeft, compLeft, readyPartial,
                   reported, reqs, envpc, envAtt, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED <<interrupted, lostCb, resubLeft>>

(* The attempt's end reaches the handle: Ready; retry ("transient",     *)
(* "incomplete"); stay Close (an interrupted attempt of a closed        *)
(* handle); or give up.                                                 *)
HDone ==
    /\ rpc = "done"
    /\ rpc' = "idle"
    /\ IF hstate = "Close"
          THEN UNCHANGED <<hstate, timerArmed, readyPartial>>
          ELSE IF outcome = "complete"
          THEN /\ hstate' = "Ready"
               /\ readyPartial' = completing
               /\ UNCHANGED timerArmed
          ELSE IF failure \in {"transient", "incomplete"}
                  THEN /\ hstate' = "None"
                       /\ timerArmed' = TRUE
                       /\ UNCHANGED readyPartial
                  ELSE /\ hstate' = "Error"
                       /\ UNCHANGED <<timerArmed, readyPartial>>
    /\ UNCHANGED <<lost, autoSkip, rp, applied, transLeft, compLeft, att,
                   attemptVars, reported, reqs, envpc, envAtt, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

HTimer ==
    /\ hstate = "None"
    /\ timerArmed
    /\ hstate' = "Init"
    /\ timerArmed' = FALSE
    /\ UNCHANGED <<lost, autoSkip, rp, applied, transLeft, compLeft, att, rpc,
                   attemptVars, readyPartial, reported, reqs, envpc, envAtt, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED extHandle

(* close() of a handle stuck on a lost callback (or any later state but *)
(* Error): cancels the retry timer, interrupts the running attempt.     *)
HClose ==
    /\ lostCb
    /\ hstate \notin {"Close", "Error"}
    /\ hstate' = "Close"
    /\ timerArmed' = FALSE
    /\ interrupted' = TRUE
    /\ UNCHANGED <<lost, autoSkip, rp, applied, transLeft, compLeft, att, rpc,
                   attemptVars, readyPartial, reported, reqs, envpc, envAtt, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED <<lostCb, cursorClosed, reopenFails, resubLeft>>

(* A re-subscribe: a new handle on the same cursor and executor, once   *)
(* the executor is free (its state starts empty).                       *)
HResub ==
    /\ hstate = "Close"
    /\ rpc = "idle"
    /\ resubLeft > 0
    /\ resubLeft' = resubLeft - 1
    /\ hstate' = "Init"
    /\ applied' = {}
    /\ readyPartial' = FALSE
    /\ interrupted' = FALSE
    /\ lostCb' = FALSE
    /\ reopenFails' = 0
    /\ UNCHANGED <<lost, autoSkip, rp, timerArmed, transLeft, compLeft, att, rpc,
                   attemptVars, reported, reqs, envpc, envAtt, qsnap>>
    /\ UNCHANGED extEnv
    /\ UNCHANGED cursorClosed

HandleStep == HStart \/ HDone \/ HTimer \/ HClose \/ HResub

(* Terminal: the handle settled and nothing is in flight (stutters, so *)
(* a finished run is not reported as a deadlock).                      *)
Settled ==
    /\ hstate \in {"Ready", "Error", "Close"}
    /\ rpc = "idle"
    /\ envpc = "idle"
    /\ reqs = <<>>
    /\ UNCHANGED vars

Next == ReplayStep \/ EnvStep \/ HandleStep \/ Settled

Spec == Init /\ [][Next]_vars
            /\ WF_vars(ReplayStep)
            /\ WF_vars(EnvStep)
            /\ WF_vars(HandleStep)

(* The same system with no fairness: stuttering forever is allowed, so  *)
(* the liveness properties must FAIL (proves liveness is checked).      *)
UnfairSpec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ rp \in 1..(N + 1)
    /\ applied \subseteq 1..N
    /\ hstate \in {"None", "Init", "Ready", "Error", "Close"}
    /\ nonrecLeft \in 0..MaxNonrec
    /\ outstanding \in 0..2
    /\ failure \in {"none", "interrupted", "incomplete"} \cup Kinds
    /\ rpc \in {"idle", "loop", "fq_room", "fq_count", "fq_flag", "fq_issue",
                "fq_ret", "poll", "end", "done"}

(* No read is issued after a read of the same attempt failed.            *)
NoReadAfterFailure == readsAfterFail = 0

(* No attempt is reported both complete and failed.                      *)
NeverBothCompleteAndFailed ==
    \A a \in 1..att : ~(<<a, "complete">> \in reported /\ <<a, "failed">> \in reported)

(* Ready without a completing failure shape means every entry applied.   *)
CompleteImpliesFullyApplied ==
    (hstate = "Ready" /\ ~readyPartial) => applied = 1..N

(* Every attempt starts from the rewound read position.                  *)
RewindBeforeRetry == (rpc # "idle") => fromRewound

(* A replay reported complete without a completing failure shape reached *)
(* the last-confirmed snapshot: "Ready" implies every record up to the   *)
(* log end at the attempt's start was applied (ReplayAttempt::run's       *)
(* drained_end check in the code).                                       *)
ReadyImpliesCaughtUp == (outcome = "complete" /\ ~completing) => caughtUp

(* A late callback of an attempt that ended never moves the shared        *)
(* cursor (nor reaches a newer attempt's queue: only Live reads enqueue). *)
LateReadsChangeNothing == ~lateMoved

(* Liveness: every attempt ends; the handle settles in Ready or Error.   *)
AttemptEnds == (rpc # "idle") ~> (rpc = "idle")
HandleSettles == <>(hstate \in {"Ready", "Error"})

(* Liveness: a closed handle's executor becomes free (even with a lost  *)
(* read callback outstanding).                                          *)
CloseFreesExecutor == (hstate = "Close" /\ rpc # "idle") ~> (rpc = "idle")
=============================================================================
