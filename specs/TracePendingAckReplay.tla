----------------------- MODULE TracePendingAckReplay -----------------------
(***************************************************************************)
(* Trace validation of src/pending_ack's replay against PendingAckReplay: *)
(* TLC replays the lines the implementation's hooks recorded (src/trace.rs,*)
(* feature `trace`, one line per spec action, named after it; read         *)
(* positions mapped to entry numbers by tests/trace_pending_ack.rs) and   *)
(* constrains PendingAckReplay's actions to follow them. Every run in      *)
(* TraceFile (tag `t`) starts with an `Init` line that pins the            *)
(* environment's initial choices (ledger lost, auto-skip, the cached       *)
(* cursor's read position); the other lines are spec actions. A line the   *)
(* spec cannot follow violates TraceFollowed (the error state's t and l    *)
(* name the run and the first unmatched line); a step the spec can follow  *)
(* but that breaks one of its invariants violates that invariant.          *)
(*                                                                         *)
(* Observation map (the values a line pins):                               *)
(*   HStart(rp): rp' = rp (the rewound start)   RLoop(to): rpc' = to        *)
(*   FqRoom(queued, room): Len(queue), rpc' # fq_ret                        *)
(*   FqCount(outstanding), FqFlag(readable): the value loaded               *)
(*   FqIssue(issued): rp <= N                   FqRet(readable)             *)
(*   Poll(entry): the head applied (0: empty)   REnd(outcome, rp)           *)
(*   EnvTake; ReadOk(rp, queued): rp', Len(queue'); ReadFail(k)             *)
(*   EnvFinish(w): the callback's step          HDone(state): hstate'       *)
(*   HTimer                                                                 *)
(***************************************************************************)
EXTENDS PendingAckReplay, Json, TLC

CONSTANT TraceFile   \* ndjson written by tests/trace_pending_ack.rs

Log == ndJsonDeserialize(TraceFile)
Runs == {Log[i].t : i \in DOMAIN Log}
FirstOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => i <= j]
LastOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => j <= i]

VARIABLES t, l   \* the run replayed and its next line

Line == Log[l]

TraceInit ==
    /\ t \in Runs
    /\ Log[FirstOf[t]].action = "Init"
    /\ l = FirstOf[t] + 1
    /\ Init
    /\ lost = Log[FirstOf[t]].lost
    /\ autoSkip = Log[FirstOf[t]].autoSkip
    /\ rp = Log[FirstOf[t]].rp
    /\ canReopen = TRUE

Is(a) == Line.action = a

IsHStart == Is("HStart") /\ HStart /\ rp' = Line.rp
IsRLoop == Is("RLoop") /\ RLoop /\ rpc' = Line.to
IsFqRoom == Is("FqRoom") /\ rpc = "fq_room" /\ FqPcOnly
            /\ Len(queue) = Line.queued /\ (rpc' # "fq_ret") = Line.room
IsFqCount == Is("FqCount") /\ rpc = "fq_count" /\ FqPcOnly
             /\ outstanding = Line.outstanding
IsFqFlag == Is("FqFlag") /\ rpc = "fq_flag" /\ FqPcOnly
            /\ readable = Line.readable
IsFqIssue == Is("FqIssue") /\ FqIssue /\ (rp <= N) = Line.issued
IsFqRet == Is("FqRet") /\ FqRet /\ readable = Line.readable
IsPoll == Is("Poll") /\ Poll
          /\ (IF Len(queue) > 0 THEN Head(queue) ELSE 0) = Line.entry
IsREnd == Is("REnd") /\ REnd /\ outcome' = Line.outcome /\ rp' = Line.rp
IsEnvTake == Is("EnvTake") /\ (EnvTake \/ EnvLate)
IsReadOk == Is("ReadOk") /\ ReadOk /\ rp' = Line.rp /\ Len(queue') = Line.queued
IsReadFail == Is("ReadFail") /\ ReadFail(Line.k)
IsEnvFinish == Is("EnvFinish") /\ envpc = Line.w /\ EnvFinish
IsHDone == Is("HDone") /\ HDone /\ hstate' = Line.state
IsHTimer == Is("HTimer") /\ HTimer

StepMatches ==
    \/ IsHStart \/ IsRLoop \/ IsFqRoom \/ IsFqCount \/ IsFqFlag \/ IsFqIssue
    \/ IsFqRet \/ IsPoll \/ IsREnd \/ IsEnvTake \/ IsReadOk \/ IsReadFail
    \/ IsEnvFinish \/ IsHDone \/ IsHTimer

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

(* Every run ends with the handle settled (Ready or Error): a recorder     *)
(* that stopped early would validate a prefix only. A run whose Init line  *)
(* carries `cut` is a prefix on purpose (the simulator closed the handle   *)
(* before it settled, or its run ended first): it need not end settled.    *)
Cut == "cut" \in DOMAIN Log[FirstOf[t]]
RunSettles == l > LastOf[t] => (hstate \in {"Ready", "Error"} \/ Cut)
=============================================================================
