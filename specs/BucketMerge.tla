----------------------------- MODULE BucketMerge -----------------------------
(***************************************************************************)
(* The bucket delayed-delivery tracker of pulsar-core (src/delayed), seed  *)
(* 000: messages are tracked in a runtime index (bitmap + counter), sealed *)
(* into buckets whose snapshots are split into segments, loaded back one   *)
(* segment at a time, merged, trimmed, and recovered after a crash.        *)
(*                                                                         *)
(* Abstractions: one entry per ledger, so a position is its ledger number  *)
(* 1..NP and a bucket range is an interval of positions; delivery times   *)
(* are fixed per position (TS; each cfg picks a timing). A seal or merge  *)
(* cuts its segments anywhere, each of at most MaxIdx indexes (Pulsar's   *)
(* max indexes, with any time step). Merge may pick any set of two or    *)
(* more contiguous buckets (no other bucket between them): a superset of  *)
(* Pulsar's selection of a window of 2..MAX_MERGE_NUM adjacent buckets,   *)
(* each with an unloaded segment.                                         *)
(* Storage is synchronous and every create/delete is atomic (redb); a     *)
(* merge replaces its sources in the same commit. Faults: a seal's create *)
(* or a retired bucket's delete may fail; read failures are stutters and  *)
(* are omitted. The clock is strict (cutoff = clock). At most MaxCrashes  *)
(* crashes.                                                               *)
(*                                                                         *)
(* Durability contract checked by NoLoss: after a crash the dispatcher     *)
(* re-reads from mark-delete; it re-dispatches expired positions and       *)
(* re-adds positions outside every committed bucket range, but for a       *)
(* not-yet-due position inside a committed range the snapshot is the only  *)
(* source (the tracker must not rely on re-reads to repair its snapshots). *)
(*                                                                         *)
(* Bug is the negative-control switch:                                     *)
(*   "none"                    the tracker as specified                    *)
(*   "merge_from_current"      merge reads segments current+1..last        *)
(*   "pop_ignores_untrack"     a pop delivers without checking untrack     *)
(*   "expired_readd"           an expired re-add leaves the bit tracked    *)
(*   "merge_persists_dispatched" merge keeps indexes no longer tracked     *)
(*   "merge_second_live_copy"  merge enqueues its first segment again for  *)
(*                             positions already queued                    *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences

CONSTANTS NP,      \* positions (ledgers) 1..NP, added in order
          MaxT,    \* the clock ranges over 0..MaxT
          TS,      \* TS[p]: delivery time of position p (a tuple over 1..MaxT)
          MaxIdx,  \* the most indexes one segment may hold
          MaxCrashes, \* crash budget
          MaxSid,  \* snapshot slots (ids are reused once deleted)
          Bug      \* the bug switch (see above)

\* The two delivery-time assignments the cfgs use for TS (TLC's cfg syntax has
\* no tuples, so each cfg substitutes one of these with `TS <- ...`).
TSTiming1 == <<2, 1, 3>>
TSTiming2 == <<1, 3, 3>>

VARIABLES clock,     \* now (ms), monotone across crashes
          nextP,     \* next position the producer adds
          index,     \* runtime index: tracked positions
          counter,   \* runtime index counter
          mheap,     \* mutable bucket heap
          queue,     \* shared queue: position -> number of entries
          segs,      \* snapshot id -> committed segments (<<>> = none)
          lo,        \* snapshot id -> first ledger of its range
          hi,        \* snapshot id -> last ledger of its range
          cur,       \* snapshot id -> loaded segment of its in-memory bucket (0 = none)
          dcount,    \* deliveries per position in this lifetime
          everDel,   \* positions ever delivered (any lifetime)
          md,        \* mark-delete: positions < md are acknowledged
          stale,     \* positions persisted by a snapshot write AFTER dispatch
          crashes    \* crashes so far

vars == <<clock, nextP, index, counter, mheap, queue, segs, lo, hi, cur,
          dcount, everDel, md, stale, crashes>>

Pos == 1..NP
Sid == 1..MaxSid

-----------------------------------------------------------------------------
(* Helpers.                                                                 *)

\* Heap order: (timestamp, position).
Less(a, b) ==
    \/ TS[a] < TS[b]
    \/ /\ TS[a] = TS[b]
       /\ a < b

\* The positions of S as a sequence in heap order.
Rank(p, S) == Cardinality({q \in S : Less(q, p)}) + 1
Sorted(S) == [i \in 1..Cardinality(S) |-> CHOOSE p \in S : Rank(p, S) = i]

MinOf(a, b) == IF a < b THEN a ELSE b

\* Segment cutting: s cut after the elements at the ranks in B (a subset of
\* 1..Len(s)-1), every segment at most MaxIdx long. Pulsar cuts at max
\* indexes or where the time step is exceeded: any such cut is one of these.
CutPt(B, n, i) == CHOOSE x \in B \cup {0, n} : Cardinality({y \in B \cup {0, n} : y < x}) = i
CutAt(s, B) ==
    [i \in 1..(Cardinality(B) + 1) |->
        SubSeq(s, CutPt(B, Len(s), i - 1) + 1, CutPt(B, Len(s), i))]
CutOK(n, B) ==
    /\ B \subseteq 1..(n - 1)
    /\ \A x \in B \cup {0} :
         \E y \in B \cup {n} : y > x /\ y - x <= MaxIdx /\ ~\E z \in B : x < z /\ z < y

Elems(s) == {s[i] : i \in 1..Len(s)}
LastOf(s) == s[Len(s)]
SetMin(S) == CHOOSE x \in S : \A y \in S : x <= y
SetMax(S) == CHOOSE x \in S : \A y \in S : x >= y

InStore(s) == segs[s] # <<>>
Buckets == {s \in Sid : cur[s] > 0}
Free == {s \in Sid : ~InStore(s)}
NewSid == SetMin(Free)

SegsFrom(s, j) == UNION {Elems(segs[s][i]) : i \in j..Len(segs[s])}
AllOf(s) == SegsFrom(s, 1)
Boundary(s) == LastOf(segs[s][cur[s]])
IsBoundary(p) == \E s \in Buckets : Boundary(s) = p

\* Adds one queue entry for each element of the set S.
Enqueue(q, S) == [p \in Pos |-> IF p \in S THEN q[p] + 1 ELSE q[p]]

Queued == {p \in Pos : queue[p] > 0}
QHead == CHOOSE p \in Queued : \A q \in Queued : p = q \/ Less(p, q)

Untracked(p) == IF p \in index THEN counter - 1 ELSE counter

Added == 1..(nextP - 1)

-----------------------------------------------------------------------------
Init ==
    /\ clock = 0
    /\ nextP = 1
    /\ index = {}
    /\ counter = 0
    /\ mheap = {}
    /\ queue = [p \in Pos |-> 0]
    /\ segs = [s \in Sid |-> <<>>]
    /\ lo = [s \in Sid |-> 0]
    /\ hi = [s \in Sid |-> 0]
    /\ cur = [s \in Sid |-> 0]
    /\ dcount = [p \in Pos |-> 0]
    /\ everDel = {}
    /\ md = 1
    /\ stale = {}
    /\ crashes = 0

\* Time passes.
Tick ==
    /\ clock < MaxT
    /\ clock' = clock + 1
    /\ UNCHANGED <<nextP, index, counter, mheap, queue, segs, lo, hi, cur,
                   dcount, everDel, md, stale, crashes>>

\* add_message of the next message. Not yet due: it lies above every range,
\* so it goes to the mutable heap and is tracked. Already due: add_message
\* returns false and the dispatcher delivers it at once.
Add ==
    /\ nextP <= NP
    /\ nextP' = nextP + 1
    /\ IF TS[nextP] > clock
       THEN /\ index' = index \cup {nextP}
            /\ counter' = counter + 1
            /\ mheap' = mheap \cup {nextP}
            /\ UNCHANGED <<dcount, everDel>>
       ELSE /\ dcount' = [dcount EXCEPT ![nextP] = @ + 1]
            /\ everDel' = everDel \cup {nextP}
            /\ UNCHANGED <<index, counter, mheap>>
    /\ UNCHANGED <<clock, queue, segs, lo, hi, cur, md, stale, crashes>>

\* getScheduledMessages step 1: due mutable entries move to the shared queue.
MoveDue ==
    LET due == {p \in mheap : TS[p] <= clock} IN
    /\ due # {}
    /\ mheap' = mheap \ due
    /\ queue' = Enqueue(queue, due)
    /\ UNCHANGED <<clock, nextP, index, counter, segs, lo, hi, cur,
                   dcount, everDel, md, stale, crashes>>

\* Seal: the mutable heap becomes a bucket; its snapshot and key commit
\* atomically, segment 1 is queued (its last index is the boundary).
Seal(B) ==
    LET new == CutAt(Sorted(mheap), B)
        s == NewSid
    IN
    /\ mheap # {}
    /\ CutOK(Cardinality(mheap), B)
    /\ Free # {}
    /\ segs' = [segs EXCEPT ![s] = new]
    /\ lo' = [lo EXCEPT ![s] = SetMin(mheap)]
    /\ hi' = [hi EXCEPT ![s] = SetMax(mheap)]
    /\ cur' = [cur EXCEPT ![s] = 1]
    /\ queue' = Enqueue(queue, Elems(new[1]))
    /\ mheap' = {}
    /\ UNCHANGED <<clock, nextP, index, counter, dcount, everDel, md, stale, crashes>>

\* Seal whose snapshot create failed: every segment stays in the queue.
SealFail ==
    /\ mheap # {}
    /\ queue' = Enqueue(queue, mheap)
    /\ mheap' = {}
    /\ UNCHANGED <<clock, nextP, index, counter, segs, lo, hi, cur,
                   dcount, everDel, md, stale, crashes>>

\* getScheduledMessages step 2 (a): the head is below mark-delete (orphan):
\* pop and untrack without delivering.
PopOrphan ==
    /\ Queued # {}
    /\ QHead < md
    /\ ~IsBoundary(QHead)
    /\ queue' = [queue EXCEPT ![QHead] = @ - 1]
    /\ index' = index \ {QHead}
    /\ counter' = Untracked(QHead)
    /\ UNCHANGED <<clock, nextP, mheap, segs, lo, hi, cur, dcount,
                   everDel, md, stale, crashes>>

\* getScheduledMessages step 2 (d): pop a due head; deliver only if untrack
\* says it was tracked (the bug delivers and decrements unconditionally).
Pop ==
    /\ Queued # {}
    /\ QHead >= md
    /\ TS[QHead] <= clock
    /\ ~IsBoundary(QHead)
    /\ LET h == QHead
           deliver == (h \in index) \/ (Bug = "pop_ignores_untrack")
       IN
       /\ queue' = [queue EXCEPT ![h] = @ - 1]
       /\ index' = index \ {h}
       /\ counter' = IF Bug = "pop_ignores_untrack" THEN counter - 1 ELSE Untracked(h)
       /\ dcount' = IF deliver THEN [dcount EXCEPT ![h] = @ + 1] ELSE dcount
       /\ everDel' = IF deliver THEN everDel \cup {h} ELSE everDel
    /\ UNCHANGED <<clock, nextP, mheap, segs, lo, hi, cur, md, stale, crashes>>

\* Step 2 (c): the head is bucket s's boundary: load its next segment, or
\* retire the bucket after its last one (deleteOk: the snapshot delete
\* succeeded; otherwise it stays in storage for recovery to clean up).
LoadNextSegment(s, deleteOk) ==
    /\ cur[s] > 0
    /\ Queued # {}
    /\ Boundary(s) = QHead
    /\ \/ TS[QHead] <= clock
       \/ QHead < md
    /\ LET last == cur[s] = Len(segs[s]) IN
       /\ cur' = [cur EXCEPT ![s] = IF last THEN 0 ELSE @ + 1]
       /\ segs' = IF last /\ deleteOk THEN [segs EXCEPT ![s] = <<>>] ELSE segs
       /\ queue' = IF last THEN queue ELSE Enqueue(queue, Elems(segs[s][cur[s] + 1]))
    /\ UNCHANGED <<clock, nextP, index, counter, mheap, lo, hi, dcount,
                   everDel, md, stale, crashes>>

\* A merge set: at least two in-memory buckets with disjoint ranges and no
\* other bucket between the lowest range and the highest (Pulsar merges a
\* window of 2..MAX_MERGE_NUM adjacent buckets). Low(S), High(S): its
\* lowest and highest bucket; the merged bucket takes Low(S)'s slot.
Low(S) == CHOOSE s \in S : \A x \in S : lo[s] <= lo[x]
High(S) == CHOOSE s \in S : \A x \in S : hi[x] <= hi[s]
Contiguous(S) ==
    /\ S \subseteq Buckets
    /\ Cardinality(S) >= 2
    /\ \A x, y \in S : x # y => (hi[x] < lo[y] \/ hi[y] < lo[x])
    /\ ~\E s3 \in Buckets \ S : lo[s3] > lo[Low(S)] /\ hi[s3] < hi[High(S)]

\* What a merge reads from one source.
MergeRead(s) ==
    IF Bug = "merge_from_current" THEN SegsFrom(s, cur[s] + 1) ELSE AllOf(s)

\* Merge: read the sources (plus the never-persisted queued positions in the
\* gaps of the merged range, so the new snapshot covers its whole range),
\* keep only indexes still tracked, commit the new snapshot replacing the
\* sources atomically (into Low(S)'s slot), then queue its first segment
\* after dropping the queue entries of the positions it now owns.
Merge(S, B) ==
    /\ Contiguous(S)
    /\ \E s1 \in {Low(S)} : \E sN \in {High(S)} :
       \E gap \in {{p \in Queued : lo[s1] <= p /\ p <= hi[sN]} \ UNION {AllOf(s) : s \in S}} :
       \E read \in {UNION {MergeRead(s) : s \in S} \cup gap} :
       \E kept \in {IF Bug = "merge_persists_dispatched" THEN read ELSE read \cap index} :
       \E new \in {IF kept = {} \/ ~CutOK(Cardinality(kept), B) THEN <<>>
                   ELSE CutAt(Sorted(kept), B)} :
       LET base == IF Bug = "merge_second_live_copy"
                   THEN queue
                   ELSE [p \in Pos |-> IF p \in kept THEN 0 ELSE queue[p]]
       IN
       /\ kept = {} \/ CutOK(Cardinality(kept), B)
       /\ segs' = [s \in Sid |-> IF s = s1 /\ kept # {} THEN new
                                 ELSE IF s \in S THEN <<>> ELSE segs[s]]
       /\ cur' = [s \in Sid |-> IF s = s1 /\ kept # {} THEN 1
                                ELSE IF s \in S THEN 0 ELSE cur[s]]
       /\ hi' = IF kept = {} THEN hi ELSE [hi EXCEPT ![s1] = hi[sN]]
       /\ queue' = IF kept = {} THEN queue ELSE Enqueue(base, Elems(new[1]))
       /\ stale' = stale \cup (kept \ index)
    /\ UNCHANGED <<clock, nextP, index, counter, mheap, lo, dcount, everDel, md, crashes>>

\* Trim: a bucket wholly below mark-delete is deleted and every bit of its
\* frozen bitmap is untracked (only tracked bits decrement the counter).
Trim(s) ==
    /\ cur[s] > 0
    /\ hi[s] < md
    /\ segs' = [segs EXCEPT ![s] = <<>>]
    /\ cur' = [cur EXCEPT ![s] = 0]
    /\ index' = index \ AllOf(s)
    /\ counter' = counter - Cardinality(index \cap AllOf(s))
    /\ UNCHANGED <<clock, nextP, mheap, queue, lo, hi, dcount, everDel,
                   md, stale, crashes>>

\* Ack: the consumer acknowledged position md (it was delivered), so
\* mark-delete advances past it.
Ack ==
    /\ md < nextP
    /\ md \in everDel
    /\ md' = md + 1
    /\ UNCHANGED <<clock, nextP, index, counter, mheap, queue, segs, lo,
                   hi, cur, dcount, everDel, stale, crashes>>

\* Crash + Recover. Recovery restores every committed snapshot from its first
\* segment with max > clock (fully expired ones are deleted) into the
\* runtime index; then the dispatcher re-reads from mark-delete: expired
\* positions are dispatched at once (add_message returns false and untracks;
\* the bug leaves the bit), uncovered ones are re-added.
MaxTs(seg) == TS[LastOf(seg)]
LiveSnap(s) == InStore(s) /\ \E j \in 1..Len(segs[s]) : MaxTs(segs[s][j]) > clock
FirstJ(s) == SetMin({j \in 1..Len(segs[s]) : MaxTs(segs[s][j]) > clock})

\* (The \E over singleton sets binds each intermediate value once.)
CrashRecover ==
    \E live \in {{s \in Sid : LiveSnap(s)}} :
    \E fj \in {[s \in Sid |-> IF s \in live THEN FirstJ(s) ELSE 0]} :
    \E restored \in {UNION {SegsFrom(s, fj[s]) : s \in live}} :
    \E loaded \in {UNION {Elems(segs[s][fj[s]]) : s \in live}} :
    \E reread \in {{p \in Added : p >= md}} :
    \E expired \in {{p \in reread : TS[p] <= clock}} :
    \E readd \in {{p \in reread \ expired :
                      /\ p \notin restored
                      /\ ~\E s \in live : lo[s] <= p /\ p <= hi[s]}} :
    \E newIndex \in {IF Bug = "expired_readd"
                     THEN restored \cup readd
                     ELSE (restored \ expired) \cup readd} :
    \E maxHi \in {IF live = {} THEN 0 ELSE SetMax({hi[s] : s \in live})} :
    /\ crashes < MaxCrashes
    /\ crashes' = crashes + 1
    /\ segs' = [s \in Sid |-> IF s \in live THEN segs[s] ELSE <<>>]
    /\ cur' = fj
    /\ index' = newIndex
    /\ counter' = Cardinality(newIndex)
    /\ queue' = [p \in Pos |-> IF p \in loaded \/ (p \in readd /\ p <= maxHi) THEN 1 ELSE 0]
    /\ mheap' = {p \in readd : p > maxHi}
    /\ dcount' = [p \in Pos |-> IF p \in expired THEN 1 ELSE 0]
    /\ everDel' = everDel \cup expired
    /\ UNCHANGED <<clock, nextP, lo, hi, md, stale>>

\* Nothing happens (keeps finished behaviours from counting as deadlocks).
Idle == UNCHANGED vars

Next ==
    \/ Tick
    \/ Add
    \/ MoveDue
    \/ \E B \in SUBSET (1..(NP - 1)) : Seal(B)
    \/ SealFail
    \/ PopOrphan
    \/ Pop
    \/ \E s \in Sid : LoadNextSegment(s, TRUE)
    \/ \E s \in Sid : LoadNextSegment(s, FALSE)
    \/ \E S \in SUBSET Sid : \E B \in SUBSET (1..(NP - 1)) : Merge(S, B)
    \/ \E s \in Sid : Trim(s)
    \/ Ack
    \/ CrashRecover
    \/ Idle

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ clock \in 0..MaxT
    /\ nextP \in 1..(NP + 1)
    /\ index \subseteq Pos
    /\ mheap \subseteq index
    /\ md \in 1..(NP + 1)
    /\ \A s \in Sid : cur[s] > 0 => InStore(s)

(* The counter always equals the runtime index's cardinality.              *)
CounterEqualsCardinality == counter = Cardinality(index)

(* Every added position that was never delivered and is not acknowledged   *)
(* is tracked (after a crash: recovered from storage or re-added).         *)
NoLoss == \A p \in Added : (p \notin everDel /\ p >= md) => p \in index

(* Within one lifetime no position is delivered twice.                     *)
NoDoubleDelivery == \A p \in Pos : dcount[p] <= 1

(* A dispatched-and-acknowledged position never returns through a snapshot *)
(* that was written after it had been dispatched.                          *)
NoDispatchedRestored == \A p \in index : p < md => p \notin stale

(* A tracked position never has two live entries in the shared queue.      *)
NoSecondLiveCopy == \A p \in index : queue[p] <= 1
=============================================================================
