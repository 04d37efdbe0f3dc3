------------------------- MODULE PendingAckReplayBatch -------------------------
(***************************************************************************)
(* Batch-index pending acks of one batch entry (pulsar-core               *)
(* src/pending_ack/state.rs, PendingAckState::check / apply): transactions *)
(* ack sets of batch indexes (ack_set) of one entry of K messages, then    *)
(* commit or abort. Pulsar keys individual pending acks by position WITH   *)
(* their ack set: a conflict is per index, and a commit/abort removes only *)
(* that transaction's indexes.                                             *)
(*                                                                         *)
(* Bug switches (negative controls):                                       *)
(*   EntryKeyed        - pending acks keyed by position only: an ack of    *)
(*                       free indexes is refused when another txn holds    *)
(*                       any index of the entry;                           *)
(*   CommitClearsEntry - a commit/abort removes every pending index of the *)
(*                       entry, other transactions' included.              *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS K,                 \* messages in the batch entry (indexes 0..K-1)
          NTxn,              \* transactions 1..NTxn
          EntryKeyed,        \* BOOLEAN bug switch
          CommitClearsEntry  \* BOOLEAN bug switch

Idx == 0..(K - 1)
Txns == 1..NTxn
None == 0

VARIABLES
    pending,     \* index -> txn holding a pending ack of it, or None
    deleted,     \* indexes deleted by committed txns
    acked,       \* txn -> indexes it acked successfully (ghost)
    resolved,    \* txns that committed or aborted
    refusedFree  \* an ack of indexes that were all free was refused

vars == <<pending, deleted, acked, resolved, refusedFree>>

Init ==
    /\ pending = [i \in Idx |-> None]
    /\ deleted = {}
    /\ acked = [t \in Txns |-> {}]
    /\ resolved = {}
    /\ refusedFree = FALSE

(* The per-index rule: an index conflicts if it is pending or deleted. *)
IndexConflict(S) == \E i \in S : pending[i] # None \/ i \in deleted
EntryConflict(t) == EntryKeyed /\ \E i \in Idx : pending[i] \notin {None, t}

Ack(t, S) ==
    /\ t \notin resolved
    /\ S # {}
    /\ IF IndexConflict(S) \/ EntryConflict(t)
          THEN /\ refusedFree' = (refusedFree \/ ~IndexConflict(S))
               /\ UNCHANGED <<pending, acked>>
          ELSE /\ pending' = [i \in Idx |-> IF i \in S THEN t ELSE pending[i]]
               /\ acked' = [acked EXCEPT ![t] = @ \cup S]
               /\ UNCHANGED refusedFree
    /\ UNCHANGED <<deleted, resolved>>

Removed(t) == {i \in Idx : pending[i] = t \/ (CommitClearsEntry /\ pending[i] # None)}

End(t, commit) ==
    /\ t \notin resolved
    /\ pending' = [i \in Idx |-> IF i \in Removed(t) THEN None ELSE pending[i]]
    /\ deleted' = (IF commit THEN deleted \cup {i \in Idx : pending[i] = t} ELSE deleted)
    /\ resolved' = resolved \cup {t}
    /\ UNCHANGED <<acked, refusedFree>>

(* Every txn resolved: the run is over (stutter, not a deadlock). *)
Done == resolved = Txns /\ UNCHANGED vars

Next ==
    \/ \E t \in Txns, S \in SUBSET Idx : Ack(t, S)
    \/ \E t \in Txns, c \in BOOLEAN : End(t, c)
    \/ Done

Spec == Init /\ [][Next]_vars

TypeOK ==
    /\ pending \in [Idx -> Txns \cup {None}]
    /\ deleted \subseteq Idx
    /\ resolved \subseteq Txns

(* An ack is refused only for a real per-index conflict. *)
RefusedOnlyOnConflict == ~refusedFree

(* Until a txn commits or aborts, every index it acked stays pending in it *)
(* (another txn's commit/abort never removes it).                          *)
PendingKeptUntilResolved ==
    \A t \in Txns \ resolved : \A i \in acked[t] : pending[i] = t

(* A pending index is never also deleted. *)
NoPendingDeleted == \A i \in Idx : pending[i] # None => i \notin deleted
=============================================================================
