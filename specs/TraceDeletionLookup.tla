------------------------- MODULE TraceDeletionLookup -------------------------
(***************************************************************************)
(* Trace validation of src/cursor against DeletionLookup: TLC replays the  *)
(* ndjson lines the implementation's hooks recorded (src/trace.rs,        *)
(* feature `trace`; one line per spec action, named after it) and         *)
(* constrains DeletionLookup's actions to follow them, line by line.      *)
(* Every run in TraceFile (tag `t`) is one initial state; TLC explores   *)
(* them all. A line the spec cannot follow violates TraceFollowed (the    *)
(* error state's t and l name the run and the first unmatched line); a   *)
(* followed line that breaks NoStalePositive is reported as that.         *)
(*                                                                         *)
(* Observation map (implementation -> spec):                              *)
(*   Ack(p)            one line per entry inserted into a live bitmap     *)
(*   Advance(c)        mark-delete published forward; c is compared       *)
(*                     up to positions holding no entry ((L, MaxEntry)    *)
(*                     and (L+1, -1) are the same cut: Same)              *)
(*   Reset*            the five steps of reset, at their stores           *)
(*   RStart(q)         epoch read: e1 must equal the spec's epoch         *)
(*   RMarkDelete       md snapshot read: must be Same as the spec's md    *)
(*   RLookup           RDirectory + RBits: the bitmap the reader reached  *)
(*                     and its timing are not observed, so any "not       *)
(*                     deleted" is accepted (stale negatives are allowed; *)
(*                     the unmodelled filters only produce those), and    *)
(*                     "deleted" must be Deleted(q) unless the epoch      *)
(*                     moved since RStart (then RRecheck must fall back)  *)
(*   RRecheck          the branch taken must be the spec's                *)
(*   RLocked, RFinish  as in the spec                                     *)
(***************************************************************************)
EXTENDS DeletionLookup, Json, TLC, Sequences

CONSTANT TraceFile   \* ndjson written by tests/trace_deletion.rs

Log == ndJsonDeserialize(TraceFile)
Runs == {Log[i].t : i \in DOMAIN Log}
FirstOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => i <= j]
LastOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => j <= i]

VARIABLES t, l   \* the run replayed and its next line

Line == Log[l]
Pos(s) == <<s[1], s[2]>>

\* Two cuts of the log are the same if no entry lies between them.
Same(a, b) == ~\E r \in Members : (Less(a, r) /\ Leq(r, b)) \/ (Less(b, r) /\ Leq(r, a))

TraceInit == Init /\ t \in Runs /\ l = FirstOf[t]

IsAck == Line.action = "Ack" /\ Ack(Pos(Line.p))
IsAdvance == Line.action = "Advance" /\ \E c \in Positions : Same(c, Pos(Line.md)) /\ Advance(c)
IsResetBegin == Line.action = "ResetBegin" /\ ResetBegin /\ epoch' = Line.epoch
IsResetInvalidate == Line.action = "ResetInvalidate" /\ ResetInvalidate
IsResetMarkDelete == Line.action = "ResetMarkDelete" /\ ResetMarkDelete(Pos(Line.md))
IsResetClear == Line.action = "ResetClear" /\ ResetClear
IsResetEnd == Line.action = "ResetEnd" /\ ResetEnd /\ epoch' = Line.epoch
IsRStart == Line.action = "RStart" /\ RStart(Pos(Line.q)) /\ e1' = Line.e1
IsRMarkDelete == Line.action = "RMarkDelete" /\ Same(md, Pos(Line.rmd)) /\ RMarkDelete
IsRLookup ==
    /\ Line.action = "RLookup"
    /\ pc = "dir"
    /\ IF Leq(q, rmd) THEN Line.ans = TRUE
       ELSE Line.ans => (Deleted(q) \/ epoch /= e1)
    /\ ans' = Line.ans
    /\ pc' = "recheck"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rmd, rid>>
IsRRecheck == Line.action = "RRecheck" /\ RRecheck /\ pc' = Line.pc
IsRLocked == Line.action = "RLocked" /\ RLocked /\ ans' = Line.ans
IsRFinish == Line.action = "RFinish" /\ RFinish

StepMatches ==
    \/ IsAck \/ IsAdvance
    \/ IsResetBegin \/ IsResetInvalidate \/ IsResetMarkDelete \/ IsResetClear \/ IsResetEnd
    \/ IsRStart \/ IsRMarkDelete \/ IsRLookup \/ IsRRecheck \/ IsRLocked \/ IsRFinish

TraceNext ==
    \/ /\ l <= LastOf[t]
       /\ StepMatches
       /\ l' = l + 1
       /\ UNCHANGED t
    \/ /\ l > LastOf[t]          \* run fully matched: stutter
       /\ UNCHANGED <<vars, t, l>>

TraceSpec == TraceInit /\ [][TraceNext]_<<vars, t, l>>

(* Every line of every run is matched by a spec step.                      *)
TraceFollowed == l <= LastOf[t] => ENABLED (StepMatches /\ l' = l + 1 /\ UNCHANGED t)
=============================================================================
