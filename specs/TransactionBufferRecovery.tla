---------------------- MODULE TransactionBufferRecovery ----------------------
(***************************************************************************)
(* Recovery of a topic's transaction buffer (Pulsar's                       *)
(* TopicTransactionBuffer; pulsar-core's src/broker/txn/buffer.rs): an      *)
(* attempt reads the topic's entries 1..N in order and applies each (a      *)
(* transactional entry opens its transaction, a marker ends it).  A read    *)
(* may fail (at most MaxFailures times in a behaviour).  As implemented:    *)
(* a failure ends the attempt at once (no read after it in that attempt),   *)
(* the attempt is not a recovery (the topic stays closed), and the next     *)
(* attempt, after a backoff, starts again from entry 1 with nothing applied *)
(* (the rewind).  The buffer is Ready only when every entry was applied.    *)
(*                                                                          *)
(* Bug switches (negative controls, Pulsar #26379):                         *)
(*   HotLoop          a failed read is re-issued inside the same attempt    *)
(*                    (the unclassified-failure hot loop)                   *)
(*                    -> NoReadAfterFailure                                 *)
(*   PartialComplete  a failure ends the attempt as if it had caught up     *)
(*                    (partial recovery reported complete)                  *)
(*                    -> ReadyImpliesFullyApplied                           *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS N, MaxFailures, HotLoop, PartialComplete

VARIABLES
    status,        \* "recovering" | "backoff" | "ready"
    next,          \* next entry the attempt reads (1..N+1)
    applied,       \* entries applied by the current attempt
    failed,        \* a read of the current attempt failed
    afterFailure,  \* reads issued in the current attempt after its failure
    failures       \* failures injected so far

vars == <<status, next, applied, failed, afterFailure, failures>>

Entries == 1..N

Init ==
    /\ status = "recovering"
    /\ next = 1
    /\ applied = {}
    /\ failed = FALSE
    /\ afterFailure = 0
    /\ failures = 0

\* A read is issued only while the attempt has not failed (HotLoop: also
\* after its failure).
CanRead == status = "recovering" /\ next <= N /\ (~failed \/ HotLoop)

ReadOk ==
    /\ CanRead
    /\ applied' = applied \cup {next}
    /\ next' = next + 1
    /\ afterFailure' = IF failed THEN afterFailure + 1 ELSE afterFailure
    /\ UNCHANGED <<status, failed, failures>>

ReadFail ==
    /\ CanRead
    /\ failures < MaxFailures
    /\ failures' = failures + 1
    /\ failed' = TRUE
    /\ afterFailure' = IF failed THEN afterFailure + 1 ELSE afterFailure
    /\ status' = IF PartialComplete THEN "ready"
                 ELSE IF HotLoop THEN "recovering" ELSE "backoff"
    /\ UNCHANGED <<next, applied>>

\* The attempt read every entry.
CaughtUp ==
    /\ status = "recovering"
    /\ next = N + 1
    /\ status' = "ready"
    /\ UNCHANGED <<next, applied, failed, afterFailure, failures>>

\* After the backoff: a new attempt from entry 1, nothing applied.
Retry ==
    /\ status = "backoff"
    /\ status' = "recovering"
    /\ next' = 1
    /\ applied' = {}
    /\ failed' = FALSE
    /\ afterFailure' = 0
    /\ UNCHANGED failures

\* Ready is final (the topic serves).
Served == status = "ready" /\ UNCHANGED vars

Next == ReadOk \/ ReadFail \/ CaughtUp \/ Retry \/ Served

Spec == Init /\ [][Next]_vars

TypeOK ==
    /\ status \in {"recovering", "backoff", "ready"}
    /\ next \in 1..(N + 1)
    /\ applied \subseteq Entries
    /\ failed \in BOOLEAN
    /\ afterFailure \in Nat
    /\ failures \in 0..MaxFailures

\* No read is issued in an attempt after one of its reads failed.
NoReadAfterFailure == afterFailure = 0

\* The buffer is Ready only with every entry of the topic applied.
ReadyImpliesFullyApplied == status = "ready" => applied = Entries
==============================================================================
