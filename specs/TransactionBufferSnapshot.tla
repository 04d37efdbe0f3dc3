---------------------- MODULE TransactionBufferSnapshot ----------------------
(***************************************************************************)
(* The transaction buffer snapshot (Pulsar's TransactionBufferSnapshot;   *)
(* pulsar-core's src/broker/txn/{buffer,snapshot,snapshots}.rs).          *)
(*                                                                          *)
(* A topic is a log of entries 1..Len(log): a data entry of a transaction, *)
(* or its commit or abort marker (a marker is written only while the       *)
(* transaction is ongoing on the topic, and no data follows it).  The     *)
(* buffer a replay gives: for each transaction the index of its first      *)
(* entry while ongoing (0 = not ongoing), the aborted set, and the max     *)
(* read position (the index before the first entry of the oldest ongoing  *)
(* transaction, else the last entry).  At any point a snapshot may be      *)
(* taken: the current max read position and aborted set.  Recovery from    *)
(* the latest snapshot starts with its aborted set and replays only the    *)
(* entries after its max read position.                                    *)
(*                                                                          *)
(* Invariant SnapshotRecoveryEqualsFullReplay: after any history, recovery *)
(* from the snapshot plus the tail gives exactly the ongoing transactions  *)
(* (with their first entry), the aborted set and the max read position of *)
(* a replay of the whole log.                                              *)
(*                                                                          *)
(* Bug switches (negative controls):                                       *)
(*   SnapshotPastOpen  the snapshot records the last entry as its max read *)
(*                     position even with a transaction ongoing (past its  *)
(*                     first entry)                                        *)
(*   SkipOne           recovery starts one entry after the snapshot's max  *)
(*                     read position (reads from the wrong position)       *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS Txns, MaxLen, SnapshotPastOpen, SkipOne

VARIABLES
    log,    \* the topic's entries: [kind |-> "data"|"commit"|"abort", txn |-> t]
    snap    \* the latest snapshot: [taken, mrp |-> i, aborted |-> S]

vars == <<log, snap>>

Empty == [first |-> [t \in Txns |-> 0], aborted |-> {}]

Step(st, i, e) ==
    CASE e.kind = "data" ->
            IF st.first[e.txn] = 0 /\ e.txn \notin st.aborted
            THEN [st EXCEPT !.first[e.txn] = i] ELSE st
      [] e.kind = "commit" -> [st EXCEPT !.first[e.txn] = 0]
      [] e.kind = "abort" ->
            [st EXCEPT !.first[e.txn] = 0, !.aborted = @ \cup {e.txn}]

RECURSIVE ReplayFrom(_, _)
\* The buffer after applying entries i..Len(log) to st.
ReplayFrom(st, i) ==
    IF i > Len(log) THEN st ELSE ReplayFrom(Step(st, i, log[i]), i + 1)

Full == ReplayFrom(Empty, 1)

Ongoing(st) == {t \in Txns : st.first[t] > 0}

MaxRead(st) ==
    IF Ongoing(st) = {} THEN Len(log)
    ELSE CHOOSE m \in {st.first[t] - 1 : t \in Ongoing(st)} :
            \A t \in Ongoing(st) : m <= st.first[t] - 1

Recovered ==
    ReplayFrom([first |-> [t \in Txns |-> 0], aborted |-> snap.aborted],
               snap.mrp + 1 + (IF SkipOne THEN 1 ELSE 0))

Ended == {log[i].txn : i \in {j \in 1..Len(log) : log[j].kind /= "data"}}

Init ==
    /\ log = <<>>
    /\ snap = [taken |-> FALSE, mrp |-> 0, aborted |-> {}]

AppendData(t) ==
    /\ Len(log) < MaxLen
    /\ t \notin Ended
    /\ log' = Append(log, [kind |-> "data", txn |-> t])
    /\ UNCHANGED snap

\* END_TXN_ON_PARTITION: a marker only for a transaction ongoing here.
AppendMarker(t, k) ==
    /\ Len(log) < MaxLen
    /\ Full.first[t] > 0
    /\ log' = Append(log, [kind |-> k, txn |-> t])
    /\ UNCHANGED snap

TakeSnapshot ==
    /\ snap' = [taken |-> TRUE,
                mrp |-> IF SnapshotPastOpen THEN Len(log) ELSE MaxRead(Full),
                aborted |-> Full.aborted]
    /\ UNCHANGED log

Next ==
    \/ \E t \in Txns : AppendData(t)
    \/ \E t \in Txns, k \in {"commit", "abort"} : AppendMarker(t, k)
    \/ TakeSnapshot

Spec == Init /\ [][Next]_vars

TypeOK ==
    /\ Len(log) <= MaxLen
    /\ \A i \in 1..Len(log) :
          log[i].kind \in {"data", "commit", "abort"} /\ log[i].txn \in Txns
    /\ snap = [taken |-> FALSE, mrp |-> 0, aborted |-> {}] \/ (snap.mrp \in 0..MaxLen /\ snap.aborted \subseteq Txns)

\* Recovery from the snapshot plus the tail = a replay of the whole topic.
SnapshotRecoveryEqualsFullReplay ==
    snap.taken =>
        /\ Recovered.first = Full.first
        /\ Recovered.aborted = Full.aborted
        /\ MaxRead(Recovered) = MaxRead(Full)
==============================================================================
