----------------------------- MODULE BucketMerge -----------------------------
(***************************************************************************)
(* Pulsar's bucket delayed-delivery tracker (BucketDelayedDeliveryTracker, *)
(* pulsar-core's src/delayed): delayed messages are tracked in a runtime   *)
(* index (bitmap + counter), sealed into buckets whose snapshots are split *)
(* into segments, loaded back one segment at a time, merged, trimmed, and  *)
(* recovered after a crash. It protects: no delayed message lost across a  *)
(* merge or a restart, none delivered twice, the count equal to the index. *)
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
(* Restart: Crash(m) loses the in-memory state and the acknowledgements   *)
(* not yet persisted (the mark-delete goes back to some m <= md); the new  *)
(* tracker recovers every committed bucket at once. The dispatcher then  *)
(* re-reads from the mark-delete, one position at a time (ReRead), while  *)
(* the tracker delivers, loads, seals, merges and the consumers ack (all  *)
(* actions interleave with the re-read; new positions are added after    *)
(* it). The cursor's read skips a position acknowledged individually     *)
(* above the mark-delete (ReReadSkip: one delivered before), so a bucket *)
(* snapshot may restore it and it stays tracked until popped: Pulsar's    *)
(* tracker restores the snapshots' bitmaps and the dispatcher drops such  *)
(* a position by the cursor's deleted state.                              *)
(*                                                                         *)
(* Durability contract checked by NoLoss: every position the re-read has *)
(* passed is tracked unless delivered or acknowledged, and a not-yet-due  *)
(* position inside a range committed at the crash (rset) is tracked from *)
(* the recovery on: for it the snapshot is the only source (the tracker  *)
(* must not rely on re-reads to repair its snapshots).                    *)
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
          crashes,   \* crashes so far
          rd,        \* the dispatcher's re-read: positions rd..nextP-1 are still to
                     \* be re-read (rd = nextP: no re-read in progress)
          rset       \* positions the last recovery had to restore (not yet due,
                     \* unacknowledged, undelivered, inside a committed range)

vars == <<clock, nextP, index, counter, mheap, queue, segs, lo, hi, cur,
          dcount, everDel, md, stale, crashes, rd, rset>>

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
Sorted(S) == LET r == [p \in S |-> Rank(p, S)]   \* each rank computed once
             IN [i \in 1..Cardinality(S) |-> CHOOSE p \in S : r[p] = i]

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
    /\ rd = 1
    /\ rset = {}

\* Time passes.
Tick ==
    /\ clock < MaxT
    /\ clock' = clock + 1
    /\ UNCHANGED <<nextP, index, counter, mheap, queue, segs, lo, hi, cur,
                   dcount, everDel, md, stale, crashes, rd, rset>>

\* add_message of the next message. Not yet due: it lies above every range,
\* so it goes to the mutable heap and is tracked. Already due: add_message
\* returns false and the dispatcher delivers it at once. The cursor reads in
\* order: a new position comes after the re-read (Add); AddNext is its step.
AddNext ==
    /\ nextP <= NP
    /\ nextP' = nextP + 1
    /\ rd' = nextP + 1
    /\ IF TS[nextP] > clock
       THEN /\ index' = index \cup {nextP}
            /\ counter' = counter + 1
            /\ mheap' = mheap \cup {nextP}
            /\ UNCHANGED <<dcount, everDel>>
       ELSE /\ dcount' = [dcount EXCEPT ![nextP] = @ + 1]
            /\ everDel' = everDel \cup {nextP}
            /\ UNCHANGED <<index, counter, mheap>>
    /\ UNCHANGED <<clock, queue, segs, lo, hi, cur, md, stale, crashes, rset>>

Add == rd = nextP /\ AddNext

\* getScheduledMessages step 1: due mutable entries move to the shared queue.
MoveDue ==
    LET due == {p \in mheap : TS[p] <= clock} IN
    /\ due # {}
    /\ mheap' = mheap \ due
    /\ queue' = Enqueue(queue, due)
    /\ UNCHANGED <<clock, nextP, index, counter, segs, lo, hi, cur,
                   dcount, everDel, md, stale, crashes, rd, rset>>

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
    /\ UNCHANGED <<clock, nextP, index, counter, dcount, everDel, md, stale, crashes, rd, rset>>

\* Seal whose snapshot create failed: every segment stays in the queue.
SealFail ==
    /\ mheap # {}
    /\ queue' = Enqueue(queue, mheap)
    /\ mheap' = {}
    /\ UNCHANGED <<clock, nextP, index, counter, segs, lo, hi, cur,
                   dcount, everDel, md, stale, crashes, rd, rset>>

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
                   everDel, md, stale, crashes, rd, rset>>

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
    /\ UNCHANGED <<clock, nextP, mheap, segs, lo, hi, cur, md, stale, crashes, rd, rset>>

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
                   everDel, md, stale, crashes, rd, rset>>

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
    /\ UNCHANGED <<clock, nextP, index, counter, mheap, lo, dcount, everDel, md, crashes, rd, rset>>

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
                   md, stale, crashes, rd, rset>>

\* Ack: the consumer acknowledged position md (it was delivered), so
\* mark-delete advances past it.
Ack ==
    /\ md < nextP
    /\ md \in everDel
    /\ md' = md + 1
    /\ UNCHANGED <<clock, nextP, index, counter, mheap, queue, segs, lo,
                   hi, cur, dcount, everDel, stale, crashes, rd, rset>>

\* Crash(m) + recovery. The acknowledgements not yet persisted are lost:
\* the mark-delete goes back to m <= md. The new tracker restores every
\* committed snapshot from its first segment with max > clock (fully
\* expired ones are deleted) into the runtime index and queues that
\* segment; the mutable heap is empty. The dispatcher's re-read starts at
\* the mark-delete (ReRead). rset: the not-yet-due, undelivered positions
\* >= md inside a range committed at the crash (NoLoss: restored now).
MaxTs(seg) == TS[LastOf(seg)]
LiveSnap(s) == InStore(s) /\ \E j \in 1..Len(segs[s]) : MaxTs(segs[s][j]) > clock
FirstJ(s) == SetMin({j \in 1..Len(segs[s]) : MaxTs(segs[s][j]) > clock})

\* (The \E over singleton sets binds each intermediate value once.)
Crash(m) ==
    \E live \in {{s \in Sid : LiveSnap(s)}} :
    \E fj \in {[s \in Sid |-> IF s \in live THEN FirstJ(s) ELSE 0]} :
    \E restored \in {UNION {SegsFrom(s, fj[s]) : s \in live}} :
    \E loaded \in {UNION {Elems(segs[s][fj[s]]) : s \in live}} :
    /\ crashes < MaxCrashes
    /\ m \in 1..md
    /\ crashes' = crashes + 1
    /\ segs' = [s \in Sid |-> IF s \in live THEN segs[s] ELSE <<>>]
    /\ cur' = fj
    /\ index' = restored
    /\ counter' = Cardinality(restored)
    /\ queue' = [p \in Pos |-> IF p \in loaded THEN 1 ELSE 0]
    /\ mheap' = {}
    /\ dcount' = [p \in Pos |-> 0]
    /\ md' = m
    /\ rd' = m
    /\ rset' = {p \in Added : /\ p >= md /\ p \notin everDel /\ TS[p] > clock
                              /\ \E s \in live : lo[s] <= p /\ p <= hi[s]}
    /\ UNCHANGED <<clock, nextP, lo, hi, everDel, stale>>

\* The re-read passes position rd without handing it to the tracker: it is
\* acknowledged (below mark-delete), or acknowledged individually, which
\* only a delivered position can be (the cursor's read skips it).
Skippable(p) == p < md \/ p \in everDel
ReReadSkip ==
    /\ rd < nextP
    /\ Skippable(rd)
    /\ rd' = rd + 1
    /\ UNCHANGED <<clock, nextP, index, counter, mheap, queue, segs, lo, hi,
                   cur, dcount, everDel, md, stale, crashes, rset>>

\* Whether p lies in an in-memory bucket's range; whether adding p to the
\* mutable heap would make its range span a bucket (the tracker first hands
\* the heap to the queue, SealFail, or seals it).
InRange(p) == \E s \in Buckets : lo[s] <= p /\ p <= hi[s]
Spans(p) == mheap # {} /\ \E s \in Buckets : SetMin(mheap) < lo[s] /\ hi[s] < p

\* The re-read hands p (rd <= p: the positions before it were passed) to
\* add_message. Expired: untracked (the bug leaves the bit) and dispatched,
\* unless a copy already went out in this lifetime (the dispatcher does not
\* send a position twice). Tracked already (restored): nothing. Otherwise
\* tracked: queued inside a bucket's range, else into the mutable heap.
ReReadAt(p) ==
    LET due == TS[p] <= clock
        keep == Bug = "expired_readd"
        new == ~due /\ p \notin index
    IN
    /\ rd <= p /\ p < nextP /\ p >= md
    /\ rd' = p + 1
    /\ ~(new /\ Spans(p))
    /\ index' = IF due THEN (IF keep THEN index ELSE index \ {p}) ELSE index \cup {p}
    /\ counter' = IF due THEN (IF keep THEN counter ELSE Untracked(p))
                  ELSE IF new THEN counter + 1 ELSE counter
    /\ dcount' = IF due /\ dcount[p] = 0 THEN [dcount EXCEPT ![p] = 1] ELSE dcount
    /\ everDel' = IF due THEN everDel \cup {p} ELSE everDel
    /\ queue' = IF new /\ InRange(p) THEN Enqueue(queue, {p}) ELSE queue
    /\ mheap' = IF new /\ ~InRange(p) THEN mheap \cup {p} ELSE mheap
    /\ UNCHANGED <<clock, nextP, segs, lo, hi, cur, md, stale, crashes, rset>>

ReRead == ReReadAt(rd)

\* Nothing happens (keeps finished behaviours from counting as deadlocks).
Idle == UNCHANGED vars

\* Each quantified action is enumerated over what can enable it (a seal needs
\* a non-empty heap, a merge a contiguous set of in-memory buckets, a load or
\* trim an in-memory bucket, a crash the budget and m <= md): the same
\* behaviours as quantifying over every value, evaluated far fewer times.
Next ==
    \/ Tick
    \/ Add
    \/ MoveDue
    \/ mheap # {} /\ \E B \in SUBSET (1..(NP - 1)) : Seal(B)
    \/ SealFail
    \/ PopOrphan
    \/ Pop
    \/ \E s \in Buckets : LoadNextSegment(s, TRUE)
    \/ \E s \in Buckets : LoadNextSegment(s, FALSE)
    \/ \E S \in SUBSET Buckets : Contiguous(S) /\ \E B \in SUBSET (1..(NP - 1)) : Merge(S, B)
    \/ \E s \in Buckets : Trim(s)
    \/ Ack
    \/ crashes < MaxCrashes /\ \E m \in 1..md : Crash(m)
    \/ ReReadSkip
    \/ ReRead
    \/ Idle

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ clock \in 0..MaxT
    /\ nextP \in 1..(NP + 1)
    /\ index \subseteq Pos
    /\ mheap \subseteq index
    /\ md \in 1..(NP + 1)
    /\ rd \in 1..(NP + 1)
    /\ rset \subseteq Pos
    /\ \A s \in Sid : cur[s] > 0 => InStore(s)

(* The counter always equals the runtime index's cardinality.              *)
CounterEqualsCardinality == counter = Cardinality(index)

(* Every added position that was never delivered and is not acknowledged   *)
(* is tracked once the re-read passed it (re-added), and from the recovery *)
(* on if it was inside a committed range (restored from the snapshot).    *)
NoLoss == \A p \in Added : (p \notin everDel /\ p >= md /\ (p < rd \/ p \in rset))
                            => p \in index

(* Within one lifetime no position is delivered twice.                     *)
NoDoubleDelivery == \A p \in Pos : dcount[p] <= 1

(* A dispatched-and-acknowledged position never returns through a snapshot *)
(* that was written after it had been dispatched.                          *)
NoDispatchedRestored == \A p \in index : p < md => p \notin stale

(* A tracked position never has two live entries in the shared queue.      *)
NoSecondLiveCopy == \A p \in index : queue[p] <= 1
=============================================================================
