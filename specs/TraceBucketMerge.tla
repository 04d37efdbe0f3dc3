-------------------------- MODULE TraceBucketMerge --------------------------
(***************************************************************************)
(* Trace validation of src/delayed's bucket tracker against BucketMerge:  *)
(* TLC replays the lines the tracker's hooks recorded (src/trace.rs,       *)
(* `bucket_merge`, feature `trace`, one line per spec action, named after  *)
(* it; runs recorded by tests/trace_bucket_merge.rs and by simulate      *)
(* --trace-dir, src/sim/sim_trace.rs: one run per subscription, positions *)
(* renumbered densely, the clock the tracker's cutoff) and constrains      *)
(* BucketMerge's actions to follow them. Each hook line carries `st`, the  *)
(* tracker's state after the action in the spec's terms, which the step    *)
(* must produce exactly (Obs). A line the spec cannot follow violates      *)
(* TraceFollowed (the error state's t and l name the run and the first     *)
(* unmatched line); a step the spec can follow but that breaks one of its  *)
(* invariants violates that invariant.                                     *)
(*                                                                         *)
(* The constants come from the trace: every run starts with an `Init` line *)
(* holding the delivery times (TS; all runs share them), MaxT and MaxIdx;  *)
(* NP and MaxSid are the number of positions.                             *)
(*                                                                         *)
(* Line -> step:                                                           *)
(*   Add(p, due)          Add (p = nextP) or, during a re-read (p < nextP), *)
(*                        ReReadAt(p) (due: TS[p] <= clock); the positions *)
(*                        between the re-read's last one and p are passed  *)
(*                        at once (ReReadSkip, each one Skippable)          *)
(*   MoveDue, SealFail    MoveDue, SealFail                                *)
(*   Seal(segs)           Seal(B), B the cut points of segs, writing       *)
(*                        exactly segs                                     *)
(*   Pop(p, orphan, delivered)  PopOrphan / Pop of the head p; delivered   *)
(*                        must be the spec's (the head was tracked); an    *)
(*                        undelivered head below md is PopOrphan           *)
(*   LoadNextSegment(lo, deleteOk)  of the bucket whose range starts at lo *)
(*   Merge(srcs, segs)    Merge(S, B) of the set S of buckets starting at  *)
(*                        srcs (2..MAX_MERGE_NUM), B the cut points of     *)
(*                        segs, writing exactly segs into Low(S)'s slot    *)
(*   Trim(lo)             Trim(s)                                          *)
(*   Ack(md)              md' - md spec Acks at once (zero: a stutter)     *)
(*   Tick(clock)          clock' - clock spec Ticks at once (environment   *)
(*                        line; the clock only moves forward)              *)
(*   Recover              Crash(m): the new tracker recovered its buckets; *)
(*                        m is the mark-delete the next line (Ack) hands   *)
(*                        it (the persisted one), else md. Its re-read's   *)
(*                        Add lines interleave with every other line.      *)
(*                                                                         *)
(* State map (Obs): clock, queue (entries per position), mheap and the     *)
(* in-memory buckets (lo, hi, cur) are compared as they are. The tracker   *)
(* untracks every acknowledged position at once (update_mark_delete), the  *)
(* spec when it pops it (PopOrphan): so index and counter are compared on  *)
(* the positions >= md, and the tracker's counter must equal the spec's    *)
(* count of them; at Recover (no mark-delete handed to the new tracker    *)
(* yet) on every position.                                                 *)
(***************************************************************************)
EXTENDS BucketMerge, Json, TLC

CONSTANT TraceFile   \* ndjson written by tests/trace_bucket_merge.rs or simulate

Log == ndJsonDeserialize(TraceFile)
Runs == {Log[i].t : i \in DOMAIN Log}
RunFirst == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => i <= j]
RunLast == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => j <= i]

\* The spec's constants, from the first run's Init line (TraceInit checks
\* that every run's agrees).
TraceTS == Log[1].ts
TraceNP == Len(Log[1].ts)
TraceMaxT == Log[1].maxT
TraceMaxIdx == Log[1].maxIdx
TraceMaxSid == Len(Log[1].ts)

VARIABLES t, l   \* the run replayed, its next line

Line == Log[l]
Is(a) == Line.action = a
ToSet(s) == {s[i] : i \in DOMAIN s}
Count(s, p) == Cardinality({i \in DOMAIN s : s[i] = p})

\* The tracker's state st (after the step) is the spec's next state.
ObsRest(st) ==
    /\ clock' = st.clock
    \* queue' has st.queue's entries per position (counted only where it
    \* has some: the queue is short, Pos is every delayed message)
    /\ LET qs == ToSet(st.queue) IN
       /\ {p \in Pos : queue'[p] > 0} = qs
       /\ \A p \in qs : queue'[p] = Count(st.queue, p)
    /\ mheap' = ToSet(st.mheap)
    /\ {<<lo'[s], hi'[s], cur'[s]>> : s \in {x \in Sid : cur'[x] > 0}} = ToSet(st.buckets)
Obs(st) ==
    /\ ToSet(st.index) = {p \in index' : p >= md'}
    /\ st.counter = counter' - Cardinality({p \in index' : p < md'})
    /\ ObsRest(st)

\* Obs before the new tracker was handed a mark-delete: every position.
ObsAll(st) ==
    /\ ToSet(st.index) = index'
    /\ st.counter = counter'
    /\ ObsRest(st)

TraceInit ==
    /\ t \in Runs
    /\ Log[RunFirst[t]].action = "Init"
    /\ Log[RunFirst[t]].ts = TS
    /\ Log[RunFirst[t]].maxT = MaxT
    /\ Log[RunFirst[t]].maxIdx = MaxIdx
    /\ l = RunFirst[t] + 1
    /\ Init

\* The re-read passes rd..p-1 (ReReadSkip steps: they change only rd, so
\* the next step may start from any of them).
PassedTo(p) == \A q \in rd..(p - 1) : Skippable(q)
IsAdd == Is("Add") /\ Line.p = nextP /\ Line.due = (TS[nextP] <= clock)
         /\ PassedTo(nextP) /\ AddNext /\ Obs(Line.st)
IsReRead == Is("Add") /\ Line.p < nextP /\ Line.due = (TS[Line.p] <= clock)
            /\ PassedTo(Line.p) /\ ReReadAt(Line.p) /\ Obs(Line.st)
\* The mark-delete the new tracker is handed after recovery (the persisted
\* one: acknowledgements not yet persisted are lost).
RecoverMd == IF l < RunLast[t] /\ Log[l + 1].action = "Ack" THEN Log[l + 1].md ELSE md
IsRecover == Is("Recover") /\ \E m \in {RecoverMd} : Crash(m) /\ ObsAll(Line.st)
IsMoveDue == Is("MoveDue") /\ MoveDue /\ Obs(Line.st)
\* The cut points of segs: the rank (heap order, among all its positions)
\* of each segment's last position but the last segment's.
SegCut(sg) == LET all == UNION {ToSet(sg[i]) : i \in DOMAIN sg} IN
              {Rank(LastOf(sg[i]), all) : i \in 1..(Len(sg) - 1)}
IsSeal == Is("Seal") /\ Line.segs # <<>>
          /\ Seal(SegCut(Line.segs)) /\ segs'[NewSid] = Line.segs /\ Obs(Line.st)
IsSealFail == Is("SealFail") /\ SealFail /\ Obs(Line.st)
IsPop == Is("Pop") /\ Queued # {} /\ QHead = Line.p
         \* A head below md that the tracker pops as due rather than as an
         \* orphan (its mark-delete ledger is md's: the tracker tells orphans
         \* by ledger) and does not deliver is the spec's PopOrphan, taken
         \* later than the spec allows.
         /\ IF Line.orphan \/ (QHead < md /\ ~Line.delivered)
            THEN PopOrphan /\ ~Line.delivered
            ELSE Pop /\ Line.delivered = (QHead \in index)
         /\ Obs(Line.st)
IsLoad == Is("LoadNextSegment") /\ \E s \in Sid :
            /\ cur[s] > 0 /\ lo[s] = Line.lo
            /\ LoadNextSegment(s, Line.deleteOk) /\ Obs(Line.st)
IsMerge == Is("Merge") /\ Len(Line.srcs) >= 2
           /\ \E S \in {{s \in Sid : cur[s] > 0 /\ lo[s] \in ToSet(Line.srcs)}} :
                 /\ Cardinality(S) = Len(Line.srcs)
                 /\ Merge(S, SegCut(Line.segs)) /\ segs'[Low(S)] = Line.segs
                 /\ Obs(Line.st)
IsTrim == Is("Trim") /\ \E s \in Sid :
            cur[s] > 0 /\ lo[s] = Line.lo /\ Trim(s) /\ Obs(Line.st)
\* The mark-delete moves from md to Line.md >= md: Line.md - md spec Acks
\* (each enabled: every position passed was added and delivered).
IsAck == Is("Ack") /\ Line.md >= md
         /\ (\A q \in md..(Line.md - 1) : q < nextP /\ q \in everDel)
         /\ md' = Line.md
         /\ UNCHANGED <<clock, nextP, index, counter, mheap, queue, segs, lo,
                        hi, cur, dcount, everDel, stale, crashes, rd, rset>>
         /\ Obs(Line.st)
\* The clock moves forward to Line.clock: Line.clock - clock spec Ticks
\* (a Tick changes nothing else).
IsTick == Is("Tick") /\ clock < Line.clock /\ Line.clock <= MaxT
          /\ clock' = Line.clock
          /\ UNCHANGED <<nextP, index, counter, mheap, queue, segs, lo, hi, cur,
                         dcount, everDel, md, stale, crashes, rd, rset>>

NormalStep ==
    \/ IsAdd \/ IsReRead \/ IsMoveDue \/ IsSeal \/ IsSealFail \/ IsPop \/ IsLoad
    \/ IsMerge \/ IsTrim \/ IsAck \/ IsTick \/ IsRecover

StepMatches == NormalStep

TraceNext ==
    \/ /\ l <= RunLast[t]
       /\ StepMatches
       /\ l' = l + 1
       /\ UNCHANGED t
    \/ /\ l > RunLast[t]          \* run fully matched: stutter
       /\ UNCHANGED <<vars, t, l>>

TraceSpec == TraceInit /\ [][TraceNext]_<<vars, t, l>>

(* Every line of every run is matched by a spec step.                      *)
TraceFollowed == l <= RunLast[t] => ENABLED (StepMatches /\ l' = l + 1 /\ UNCHANGED t)

=============================================================================
