-------------------------- MODULE TraceLedgerCursor --------------------------
(***************************************************************************)
(* Trace validation of src/ledger's cursor against LedgerCursor: TLC      *)
(* replays the lines the implementation's hooks recorded (src/trace.rs,   *)
(* feature `trace`, one line per spec action, named after it; positions   *)
(* flattened to entry numbers by tests/trace_ledger_cursor.rs) and        *)
(* constrains LedgerCursor's actions to follow them. Every run in         *)
(* TraceFile (tag `t`) is one initial state. A line the spec cannot       *)
(* follow violates TraceFollowed (the error state's t and l name the run  *)
(* and the first unmatched line).                                         *)
(*                                                                         *)
(* Observation map: AppendEntry(p) -> lce' = p; Read(k) -> read' = read;  *)
(* ReadRun(first, last) -> read' = read; SkipTo(r) -> read' = read;       *)
(* MarkDelete(md) -> md' = md, read' = read; Rewind -> read' = read;      *)
(* Reset -> md' = md, read' = read; Recover -> the recovered mark-delete  *)
(* must be the one persisted (md), read' = read; Open -> md = md, read =  *)
(* read (a new cursor starts at Init). Lines of one managed ledger; the   *)
(* writers drop the `ml`/`cur` names.                                     *)
(***************************************************************************)
EXTENDS LedgerCursor, Json, TLC, Sequences

CONSTANT TraceFile   \* ndjson written by tests/trace_ledger_cursor.rs

Log == ndJsonDeserialize(TraceFile)
Runs == {Log[i].t : i \in DOMAIN Log}
FirstOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => i <= j]
LastOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => j <= i]

VARIABLES t, l   \* the run replayed and its next line

Line == Log[l]

TraceInit == Init /\ t \in Runs /\ l = FirstOf[t]

IsAppendEntry == Line.action = "AppendEntry" /\ AppendEntry /\ lce' = Line.p
IsRead == Line.action = "Read" /\ Read(Line.k) /\ read' = Line.read
IsMarkDelete == Line.action = "MarkDelete" /\ MarkDelete(Line.md) /\ read' = Line.read
IsRewind == Line.action = "Rewind" /\ Rewind /\ read' = Line.read
IsReadRun ==
    /\ Line.action = "ReadRun"
    /\ ReadRun(Line.first, Line.last)
    /\ read' = Line.read
IsSkipTo == Line.action = "SkipTo" /\ SkipTo(Line.read)
IsReset == Line.action = "Reset" /\ Reset(Line.read) /\ md' = Line.md
IsRecover == Line.action = "Recover" /\ md = Line.md /\ Recover /\ read' = Line.read
(* Not spec actions: the run's header (the cfg constants it was written   *)
(* for) and a new cursor's start, which must be the spec's Init state.    *)
IsInit == Line.action = "Init" /\ UNCHANGED vars
IsOpen ==
    /\ Line.action = "Open"
    /\ Line.md = -1 /\ Line.read = 0
    /\ md = Line.md /\ read = Line.read
    /\ UNCHANGED vars

StepMatches ==
    \/ IsAppendEntry \/ IsRead \/ IsReadRun \/ IsSkipTo
    \/ IsMarkDelete \/ IsRewind \/ IsReset \/ IsRecover
    \/ IsInit \/ IsOpen

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
