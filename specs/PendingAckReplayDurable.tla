----------------------- MODULE PendingAckReplayDurable -----------------------
(***************************************************************************)
(* Durability of committed transactional acks across crashes (pulsar-core *)
(* src/pending_ack: PendingAckHandle with its SubscriptionView;            *)
(* PendingAckState::take_trim / committed_acks). Pulsar's                  *)
(* MLPendingAckStore trims the pending-ack log only up to what the         *)
(* subscription cursor has durably persisted, and its replay re-applies    *)
(* commits; the handle checks the subscription cursor before accepting a   *)
(* transactional ack (TransactionConflictException).                       *)
(*                                                                         *)
(* Durable state: the pending-ack log (records appended, a trimmed prefix  *)
(* of length md) and the subscription cursor's persisted deleted set       *)
(* subDurable. In memory: the subscription's live deleted set subLive,     *)
(* the handle's pending acks, and the committed acks handed to the         *)
(* embedder but not yet applied to the subscription (toApply). Every       *)
(* durable write (log append, log trim, subscription persist) is its own   *)
(* step and Crash is enabled in every state with the broker up, so a crash *)
(* falls between any two durable writes; it keeps only the durable state. *)
(* Recover is the replay (its read pipeline is PendingAckReplay.tla): the  *)
(* untrimmed log's open transactions become pending again, and its         *)
(* committed acks the subscription does not hold durably are handed back  *)
(* to be re-applied.                                                       *)
(*                                                                         *)
(* Bug switches (negative controls):                                       *)
(*   TrimBeforeApply - the log is trimmed as soon as every transaction of  *)
(*                     a prefix is resolved, before the subscription has   *)
(*                     persisted the commits (the commit then exists       *)
(*                     nowhere until the subscription persists);           *)
(*   NoConflictCheck - a transactional ack of a position the subscription *)
(*                     already deleted is accepted.                        *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS Pos,              \* topic entries of the subscription
          Txns,             \* transactions
          TrimBeforeApply,  \* BOOLEAN bug switch
          NoConflictCheck   \* BOOLEAN bug switch

Ops == {"ack", "commit", "abort"}
Rec == [op : Ops, t : Txns, p : Pos]

VARIABLES
    log,         \* the pending-ack log (durable), records in append order
    md,          \* the log's trimmed prefix (its cursor's mark-delete)
    subDurable,  \* the subscription's persisted deleted entries
    subLive,     \* the subscription's live deleted entries
    pending,     \* the handle's pending acks: set of <<txn, position>>
    toApply,     \* committed acks handed to the embedder, not yet applied
    up,          \* the broker is running
    status       \* txn -> "none" | "open" | "committed" | "aborted" (ghost:
                 \* the coordinator's outcome once its record is durable)

vars == <<log, md, subDurable, subLive, pending, toApply, up, status>>

Init ==
    /\ log = <<>>
    /\ md = 0
    /\ subDurable = {}
    /\ subLive = {}
    /\ pending = {}
    /\ toApply = {}
    /\ up = TRUE
    /\ status = [t \in Txns |-> "none"]

Untrimmed == {i \in 1..Len(log) : i > md}
ResolvedIn(t, S) == \E j \in S : log[j].op \in {"commit", "abort"} /\ log[j].t = t
CommittedIn(t, S) == \E j \in S : log[j].op = "commit" /\ log[j].t = t
PendingOn(p) == \E q \in pending : q[2] = p

(* A transactional ack: refused (nothing written) if the position is       *)
(* pending in another transaction, or deleted by the subscription or by a  *)
(* commit the handle holds (its PendingAckState) and the embedder has not  *)
(* applied yet.                                                            *)
TxnAck(t, p) ==
    /\ up
    /\ status[t] = "none"
    /\ ~PendingOn(p)
    /\ NoConflictCheck \/ p \notin subLive \cup toApply
    /\ log' = Append(log, [op |-> "ack", t |-> t, p |-> p])
    /\ pending' = pending \cup {<<t, p>>}
    /\ status' = [status EXCEPT ![t] = "open"]
    /\ UNCHANGED <<md, subDurable, subLive, toApply, up>>

(* A plain (non-transactional) ack: the subscription deletes the entry.    *)
PlainAck(p) ==
    /\ up
    /\ p \notin subLive
    /\ ~PendingOn(p)
    /\ subLive' = subLive \cup {p}
    /\ UNCHANGED <<log, md, subDurable, pending, toApply, up, status>>

(* COMMIT/ABORT appended; once durable the handle resolves the txn and a   *)
(* commit's acks are handed to the embedder (the append callback).         *)
End(t, commit) ==
    /\ up
    /\ \E q \in pending : q[1] = t
    /\ log' = Append(log, [op |-> IF commit THEN "commit" ELSE "abort",
                           t |-> t,
                           p |-> CHOOSE p \in Pos : TRUE])
    /\ pending' = {q \in pending : q[1] # t}
    /\ toApply' = IF commit THEN toApply \cup {q[2] : q \in {r \in pending : r[1] = t}}
                            ELSE toApply
    /\ status' = [status EXCEPT ![t] = IF commit THEN "committed" ELSE "aborted"]
    /\ UNCHANGED <<md, subDurable, subLive, up>>

(* The embedder applies a committed ack to the subscription's live state. *)
Apply(p) ==
    /\ up
    /\ p \in toApply
    /\ subLive' = subLive \cup {p}
    /\ toApply' = toApply \ {p}
    /\ UNCHANGED <<log, md, subDurable, pending, up, status>>

(* The subscription cursor is persisted (mark-delete + deleted ranges).   *)
Persist ==
    /\ up
    /\ subDurable # subLive
    /\ subDurable' = subLive
    /\ UNCHANGED <<log, md, subLive, pending, toApply, up, status>>

(* Log entry i may be trimmed: a resolved ACK whose commit, if any, the   *)
(* subscription holds durably (TrimBeforeApply: resolved is enough).      *)
Trimmable(i) ==
    \/ log[i].op # "ack"
    \/ /\ ResolvedIn(log[i].t, 1..Len(log))
       /\ TrimBeforeApply
          \/ ~CommittedIn(log[i].t, 1..Len(log))
          \/ log[i].p \in subDurable

(* The handle trims the log to the end of the longest trimmable prefix.   *)
TrimTo == {k \in (md + 1)..Len(log) : \A i \in (md + 1)..k : Trimmable(i)}

Trim ==
    /\ up
    /\ TrimTo # {}
    /\ md' = CHOOSE k \in TrimTo : \A j \in TrimTo : j <= k
    /\ UNCHANGED <<log, subDurable, subLive, pending, toApply, up, status>>

(* A crash: only the durable state survives.                              *)
Crash ==
    /\ up
    /\ up' = FALSE
    /\ subLive' = subDurable
    /\ pending' = {}
    /\ toApply' = {}
    /\ UNCHANGED <<log, md, subDurable, status>>

(* Restart and replay of the untrimmed log.                               *)
Recover ==
    /\ ~up
    /\ up' = TRUE
    /\ pending' = {<<log[i].t, log[i].p>> :
                     i \in {j \in Untrimmed : log[j].op = "ack"
                                              /\ ~ResolvedIn(log[j].t, Untrimmed)}}
    /\ toApply' = {log[i].p :
                     i \in {j \in Untrimmed : log[j].op = "ack"
                                              /\ CommittedIn(log[j].t, Untrimmed)
                                              /\ log[j].p \notin subDurable}}
    /\ UNCHANGED <<log, md, subDurable, subLive, status>>

Next ==
    \/ \E t \in Txns, p \in Pos : TxnAck(t, p)
    \/ \E p \in Pos : PlainAck(p)
    \/ \E t \in Txns, c \in BOOLEAN : End(t, c)
    \/ \E p \in Pos : Apply(p)
    \/ Persist
    \/ Trim
    \/ Crash
    \/ Recover

Spec == Init /\ [][Next]_vars

TypeOK ==
    /\ log \in Seq(Rec)
    /\ md \in 0..Len(log)
    /\ subDurable \subseteq subLive
    /\ subLive \subseteq Pos
    /\ pending \subseteq Txns \X Pos
    /\ toApply \subseteq Pos
    /\ up \in BOOLEAN
    /\ status \in [Txns -> {"none", "open", "committed", "aborted"}]

(* A committed transactional ack is in the subscription's durable state,  *)
(* or the next replay re-applies it: its ACK record (and so the COMMIT    *)
(* after it) is still in the untrimmed log.                               *)
CommittedAckDurable ==
    \A i \in 1..Len(log) :
        (log[i].op = "ack" /\ status[log[i].t] = "committed")
            => (log[i].p \in subDurable \/ i > md)

(* A transactional ack never holds a position the subscription deleted    *)
(* (TransactionConflictException).                                         *)
PendingNotDeleted == \A q \in pending : q[2] \notin subLive

(* The log is trimmed only past resolved transactions.                    *)
OpenNeverTrimmed ==
    \A i \in 1..md : log[i].op = "ack" => status[log[i].t] # "open"
=============================================================================
