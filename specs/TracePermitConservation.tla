---------------------- MODULE TracePermitConservation ----------------------
(***************************************************************************)
(* Trace validation of src/permits against PermitConservation: TLC replays *)
(* the lines the implementation's hooks recorded (src/trace.rs, feature    *)
(* `trace`, one line per spec action, named after it) from the runs of     *)
(* tests/trace_permits.rs (the real SharedDispatcher and ClientConsumer,   *)
(* FIFO channels in the test) or of `pulsar-core simulate --trace-dir`     *)
(* (src/sim/sim_trace.rs: one run per consumer id on one connection) and   *)
(* constrains PermitConservation's actions to follow them. Every run in    *)
(* TraceFile (tag `t`) is one initial state and starts with an `Init` line *)
(* holding the constants RQ, MaxP and MaxInc (all runs of a file share     *)
(* them: TraceInit checks it).                                             *)
(* A line the spec cannot follow violates TraceFollowed (the error state's *)
(* t and l name the run and the first unmatched line); a followed step     *)
(* that breaks Conservation, NoExcessCredit or NoStaleCredit violates it.  *)
(*                                                                         *)
(* Observation map: BrokerSend(p); BrokerRecv(f, n): the head frame's kind *)
(* (and a Flow's permits); ClientReceive(d, stale): d messages handed off  *)
(* by the current incarnation, or discarded as a replaced one's;           *)
(* AppReturn(i); Drain(n): acc[inc] = n; ConnTaskWrite(n, written): the    *)
(* head request's permits and whether it was written; Replace;             *)
(* FlushResidual(n): acc[inc] = n, written as a Flow at once;             *)
(* BrokerWriteFailure(why): the broker removed the registered consumer     *)
(* with no client frame (a failed write, or its connection closed).        *)
(***************************************************************************)
EXTENDS PermitConservation, Json, TLC, FiniteSets

CONSTANT TraceFile   \* ndjson written by tests/trace_permits.rs

Log == ndJsonDeserialize(TraceFile)
Runs == {Log[i].t : i \in DOMAIN Log}
\* A run's lines are contiguous (both recorders write them so; checked
\* below), so its first and last lines are where the tag changes.
RunStarts == {i \in DOMAIN Log : i = 1 \/ Log[i - 1].t # Log[i].t}
ASSUME Cardinality(RunStarts) = Cardinality(Runs)
FirstOf == [k \in Runs |-> CHOOSE i \in RunStarts : Log[i].t = k]
LastOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ (i = Len(Log) \/ Log[i + 1].t # k)]

\* The spec's constants, from the first run's Init line.
TraceRQ == Log[1].rq
TraceMaxP == Log[1].maxP
TraceMaxInc == Log[1].maxInc

VARIABLES t, l   \* the run replayed and its next line

Line == Log[l]

TraceInit ==
    /\ t \in Runs
    /\ Log[FirstOf[t]].action = "Init"
    /\ Log[FirstOf[t]].rq = RQ
    /\ Log[FirstOf[t]].maxP = MaxP
    /\ Log[FirstOf[t]].maxInc = MaxInc
    /\ l = FirstOf[t] + 1
    /\ Init

Is(a) == Line.action = a

IsBrokerSend == Is("BrokerSend") /\ BrokerSend(Line.p)
IsBrokerRecv == Is("BrokerRecv") /\ chan # <<>> /\ Head(chan).t = Line.f
                /\ (Line.f = "flow" => Head(chan).n = Line.n) /\ BrokerRecv
IsClientReceive == Is("ClientReceive") /\ down # <<>>
                   /\ IF Head(down).i = inc
                         THEN ~Line.stale /\ ClientReceive /\ held'[inc] = held[inc] + Line.d
                         ELSE Line.stale /\ ClientReceive
IsAppReturn == Is("AppReturn") /\ AppReturn(Line.i)
IsDrain == Is("Drain") /\ acc[inc] = Line.n /\ Drain
IsConnTaskWrite == Is("ConnTaskWrite") /\ pend # <<>> /\ Head(pend).n = Line.n
                   /\ WriteAllowed(Head(pend).i) = Line.written /\ ConnTaskWrite
IsReplace == Is("Replace") /\ Replace
IsBrokerWriteFailure == Is("BrokerWriteFailure") /\ BrokerWriteFailure
IsFlushResidual == Is("FlushResidual") /\ acc[inc] = Line.n /\ FlushResidual

StepMatches ==
    \/ IsBrokerSend \/ IsBrokerRecv \/ IsClientReceive \/ IsAppReturn
    \/ IsDrain \/ IsConnTaskWrite \/ IsReplace \/ IsBrokerWriteFailure
    \/ IsFlushResidual

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
