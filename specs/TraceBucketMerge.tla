-------------------------- MODULE TraceBucketMerge --------------------------
(***************************************************************************)
(* Trace validation of src/delayed's bucket tracker against BucketMerge:  *)
(* TLC replays the lines the tracker's hooks recorded (src/trace.rs,       *)
(* `bucket_merge`, feature `trace`, one line per spec action, named after  *)
(* it; runs recorded by tests/trace_bucket_merge.rs) and constrains        *)
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
(*   Add(p, due)          Add (p = nextP; due: TS[p] <= clock)             *)
(*   MoveDue, SealFail    MoveDue, SealFail                                *)
(*   Seal(segs)           Seal(k) for some k, writing exactly segs         *)
(*   Pop(p, orphan, delivered)  PopOrphan / Pop of the head p; delivered   *)
(*                        must be the spec's (the head was tracked)        *)
(*   LoadNextSegment(lo, deleteOk)  of the bucket whose range starts at lo *)
(*   Merge(srcs, segs)    Merge(s1, s2, k) of the two buckets starting at  *)
(*                        srcs, writing exactly segs into s1               *)
(*   Trim(lo), Ack(md)    Trim(s), Ack (md' = md)                          *)
(*   Tick(clock)          Tick (environment line)                         *)
(*   Recover ... ReReadDone   one CrashRecover: the Recover line (the new  *)
(*                        tracker recovered its buckets) starts the        *)
(*                        dispatcher's re-read, whose Add lines (and the   *)
(*                        mark-delete handed to the new tracker) are the   *)
(*                        re-adds CrashRecover performs atomically; at     *)
(*                        ReReadDone the state after the last re-read line *)
(*                        must be CrashRecover's.                          *)
(*                                                                         *)
(* State map (Obs): clock, queue (entries per position), mheap and the     *)
(* in-memory buckets (lo, hi, cur) are compared as they are. The tracker   *)
(* untracks every acknowledged position at once (update_mark_delete), the  *)
(* spec when it pops it (PopOrphan): so index and counter are compared on  *)
(* the positions >= md, and the tracker's counter must equal the spec's    *)
(* count of them.                                                          *)
(***************************************************************************)
EXTENDS BucketMerge, Json, TLC

CONSTANT TraceFile   \* ndjson written by tests/trace_bucket_merge.rs

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

VARIABLES t, l, rr   \* the run replayed, its next line, inside a re-read

Line == Log[l]
Is(a) == Line.action = a
ToSet(s) == {s[i] : i \in DOMAIN s}
Count(s, p) == Cardinality({i \in DOMAIN s : s[i] = p})

\* The tracker's state st (after the step) is the spec's next state.
Obs(st) ==
    /\ clock' = st.clock
    /\ ToSet(st.index) = {p \in index' : p >= md'}
    /\ st.counter = counter' - Cardinality({p \in index' : p < md'})
    /\ queue' = [p \in Pos |-> Count(st.queue, p)]
    /\ mheap' = ToSet(st.mheap)
    /\ {<<lo'[s], hi'[s], cur'[s]>> : s \in {x \in Sid : cur'[x] > 0}} = ToSet(st.buckets)

TraceInit ==
    /\ t \in Runs
    /\ Log[RunFirst[t]].action = "Init"
    /\ Log[RunFirst[t]].ts = TS
    /\ Log[RunFirst[t]].maxT = MaxT
    /\ Log[RunFirst[t]].maxIdx = MaxIdx
    /\ l = RunFirst[t] + 1
    /\ rr = FALSE
    /\ Init

IsAdd == Is("Add") /\ Line.p = nextP /\ Line.due = (TS[nextP] <= clock)
         /\ Add /\ Obs(Line.st)
IsMoveDue == Is("MoveDue") /\ MoveDue /\ Obs(Line.st)
IsSeal == Is("Seal") /\ \E k \in 1..MaxIdx :
            Seal(k) /\ segs'[NewSid] = Line.segs /\ Obs(Line.st)
IsSealFail == Is("SealFail") /\ SealFail /\ Obs(Line.st)
IsPop == Is("Pop") /\ Queued # {} /\ QHead = Line.p
         /\ IF Line.orphan
            THEN PopOrphan /\ ~Line.delivered
            ELSE Pop /\ Line.delivered = (QHead \in index)
         /\ Obs(Line.st)
IsLoad == Is("LoadNextSegment") /\ \E s \in Sid :
            /\ cur[s] > 0 /\ lo[s] = Line.lo
            /\ LoadNextSegment(s, Line.deleteOk) /\ Obs(Line.st)
IsMerge == Is("Merge") /\ Len(Line.srcs) = 2 /\ \E s1, s2 \in Sid :
            /\ cur[s1] > 0 /\ lo[s1] = Line.srcs[1]
            /\ cur[s2] > 0 /\ lo[s2] = Line.srcs[2]
            /\ \E k \in 1..MaxIdx : Merge(s1, s2, k) /\ segs'[s1] = Line.segs
            /\ Obs(Line.st)
IsTrim == Is("Trim") /\ \E s \in Sid :
            cur[s] > 0 /\ lo[s] = Line.lo /\ Trim(s) /\ Obs(Line.st)
IsAck == Is("Ack") /\ Line.md = md + 1 /\ Ack /\ Obs(Line.st)
IsTick == Is("Tick") /\ Tick /\ clock' = Line.clock

\* Lines of the dispatcher's re-read after a restart: CrashRecover does them
\* atomically at ReReadDone.
IsReRead == (Is("Add") \/ Is("SealFail") \/ (Is("Ack") /\ Line.md = md))
            /\ UNCHANGED vars

NormalStep ==
    \/ IsAdd \/ IsMoveDue \/ IsSeal \/ IsSealFail \/ IsPop \/ IsLoad
    \/ IsMerge \/ IsTrim \/ IsAck \/ IsTick

StepMatches ==
    \/ ~rr /\ NormalStep /\ UNCHANGED rr
    \/ ~rr /\ Is("Recover") /\ rr' = TRUE /\ UNCHANGED vars
    \/ rr /\ IsReRead /\ UNCHANGED rr
    \/ rr /\ Is("ReReadDone") /\ CrashRecover /\ Obs(Log[l - 1].st) /\ rr' = FALSE

TraceNext ==
    \/ /\ l <= RunLast[t]
       /\ StepMatches
       /\ l' = l + 1
       /\ UNCHANGED t
    \/ /\ l > RunLast[t]          \* run fully matched: stutter
       /\ UNCHANGED <<vars, t, l, rr>>

TraceSpec == TraceInit /\ [][TraceNext]_<<vars, t, l, rr>>

(* Every line of every run is matched by a spec step.                      *)
TraceFollowed == l <= RunLast[t] => ENABLED (StepMatches /\ l' = l + 1 /\ UNCHANGED t)

(* No run ends inside a re-read (a recorder cut off after a restart would  *)
(* leave its CrashRecover unchecked).                                      *)
RunEndsOutsideReRead == l > RunLast[t] => ~rr
=============================================================================
