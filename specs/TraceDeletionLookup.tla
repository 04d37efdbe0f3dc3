------------------------- MODULE TraceDeletionLookup -------------------------
(***************************************************************************)
(* Trace validation of src/deletion against DeletionLookup: TLC replays the  *)
(* ndjson lines the implementation's hooks recorded (src/trace.rs,        *)
(* feature `trace`; one line per spec action, named after it) and         *)
(* constrains DeletionLookup's actions to follow them, line by line.      *)
(* Every run in TraceFile (tag `t`: one cursor deletion state) is one     *)
(* initial state; TLC explores them all. A line the spec cannot follow    *)
(* violates TraceFollowed (the error state's t and l name the run and the *)
(* first unmatched line); a followed line that breaks NoStalePositive is  *)
(* reported as that.                                                       *)
(*                                                                         *)
(* Observation map (implementation -> spec):                              *)
(*   Open(md, ranges)  the state as created (new or recovered): the       *)
(*                     initial state, its deleted entries in the map and  *)
(*                     the published directory; l starts at it (a         *)
(*                     stutter step moves past it). `pred` (simulator     *)
(*                     runs): the state was recovered from its cursor's   *)
(*                     store record after a restart, and run `pred` was   *)
(*                     the cursor's previous state (RecoveredAsPersisted) *)
(*   Persist(md, ranges) the cursor committed its cursor info (mark-      *)
(*                     delete + individually deleted ranges) to the       *)
(*                     store; not a DeletionLookup action (stutter): what *)
(*                     a recovered state must equal                       *)
(*   Ack(p)            one line per entry inserted into a live bitmap     *)
(*   MarkDelete(c)     an explicit mark-delete to c past the current md   *)
(*                     (recorded under the write lock before the Advance  *)
(*                     line it causes): the next Advance line is the      *)
(*                     spec's MarkDelete(c, md) instead of Advance(md)    *)
(*   Advance(md)       mark-delete published forward at md                *)
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
(*                                                                         *)
(* RecoveredAsPersisted (Pulsar: a cursor recovered after a restart holds *)
(* the mark-delete and individualDeletedMessages its ManagedCursorImpl     *)
(* last persisted, neither fewer acknowledgements nor ones not yet         *)
(* persisted): a run whose Open names `pred` opens with the md and the     *)
(* deleted entries of run pred's last Persist line, or, if pred persisted  *)
(* nothing, of pred's own Open (the store still holds what pred was        *)
(* recovered from, or a new cursor's first record).                        *)
(*                                                                         *)
(* LastEntry is the layout of the managed ledger recorded (the file's     *)
(* first line's `layout`: [ledger id, last entry id] pairs), else the     *)
(* model's DefaultLastEntry.                                               *)
(***************************************************************************)
EXTENDS DeletionLookup, Json, TLC, Sequences

CONSTANT TraceFile   \* ndjson: tests/trace_deletion.rs, tests/trace_deletion_model.rs or `simulate --trace-dir`

Log == ndJsonDeserialize(TraceFile)
Runs == {Log[i].t : i \in DOMAIN Log}
FirstOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => i <= j]
LastOf == [k \in Runs |-> CHOOSE i \in DOMAIN Log :
              Log[i].t = k /\ \A j \in DOMAIN Log : Log[j].t = k => j <= i]

\* The recorded layout (cfg: `LastEntry <- TraceLastEntry`).
LayoutPairs == {Log[1].layout[i] : i \in DOMAIN Log[1].layout}
TraceLastEntry ==
    IF "layout" \in DOMAIN Log[1]
      THEN [k \in {x[1] : x \in LayoutPairs} |-> (CHOOSE x \in LayoutPairs : x[1] = k)[2]]
      ELSE DefaultLastEntry

VARIABLES t,      \* the run replayed
          l,      \* its next line
          mdFrom  \* an explicit mark-delete's target, until its Advance

Line == Log[l]
Pos(s) == <<s[1], s[2]>>

\* Two cuts of the log are the same if no entry lies between them.
Same(a, b) == ~\E r \in Members : (Less(a, r) /\ Leq(r, b)) \/ (Less(b, r) /\ Leq(r, a))

\* The recovered deleted entries of an Open line: open-closed ranges.
OpenDeleted(h) ==
    {r \in Members : \E i \in DOMAIN h.ranges :
        Less(Pos(h.ranges[i][1]), r) /\ Leq(r, Pos(h.ranges[i][2]))}
\* One bitmap per ledger holding deleted entries, ids by ledger order.
Rank(k) == Cardinality({k2 \in Ledgers : k2 <= k})

OpenInit(h) ==
    LET del == OpenDeleted(h)
        has(k) == \E r \in del : r[1] = k
    IN /\ md = Pos(h.md)
       /\ bm = [i \in Ids |-> IF \E k \in Ledgers : Rank(k) = i /\ has(k)
                               THEN {r[2] : r \in {x \in del : Rank(x[1]) = i}}
                               ELSE {}]
       /\ map = [k \in Ledgers |-> IF has(k) THEN Rank(k) ELSE NoId]
       /\ dir = [k \in Ledgers |-> IF has(k) THEN Rank(k) ELSE NoId]
       /\ nextId = Cardinality(Ledgers) + 1
       /\ epoch = 0
       /\ resets = 0
       /\ writer = "none"
       /\ pc = "idle"
       /\ q = <<1, 0>>
       /\ e1 = 0
       /\ rmd = <<1, -1>>
       /\ rid = NoId
       /\ ans = FALSE

TraceInit ==
    /\ t \in Runs
    /\ mdFrom = NoPos
    /\ l = FirstOf[t]
    /\ IF Log[FirstOf[t]].action = "Open"
         THEN OpenInit(Log[FirstOf[t]])
         ELSE Init

\* What run k's cursor held in the store when its state was dropped: its
\* last Persist line; if it persisted nothing, its Open.
PersistLines(k) == {i \in DOMAIN Log : Log[i].t = k /\ Log[i].action = "Persist"}
PersistedBy(k) ==
    IF PersistLines(k) = {} THEN Log[FirstOf[k]]
    ELSE Log[CHOOSE i \in PersistLines(k) : \A j \in PersistLines(k) : j <= i]
\* A recovered Open equals what the previous state persisted: the same
\* mark-delete and the same individually deleted entries.
AsPersisted(h) ==
    /\ h.pred \in Runs
    /\ Pos(h.md) = Pos(PersistedBy(h.pred).md)
    /\ OpenDeleted(h) = OpenDeleted(PersistedBy(h.pred))

IsOpen == Line.action = "Open" /\ l = FirstOf[t] /\ UNCHANGED <<vars, mdFrom>>
IsPersist == Line.action = "Persist" /\ UNCHANGED <<vars, mdFrom>>
IsAck == Line.action = "Ack" /\ mdFrom = NoPos /\ Ack(Pos(Line.p)) /\ UNCHANGED mdFrom
IsMarkDelete ==
    /\ Line.action = "MarkDelete"
    /\ mdFrom = NoPos
    /\ WriterMayAct
    /\ Less(md, Pos(Line.c))
    /\ mdFrom' = Pos(Line.c)
    /\ UNCHANGED vars
IsAdvance ==
    /\ Line.action = "Advance"
    /\ IF mdFrom = NoPos THEN Advance(Pos(Line.md)) ELSE MarkDelete(mdFrom, Pos(Line.md))
    /\ mdFrom' = NoPos
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

\* An explicit mark-delete's MarkDelete line is followed by its Advance
\* before any other writer step (it holds the write lock): only reader
\* steps may come between.
StepMatches ==
    \/ IsOpen \/ IsPersist
    \/ IsAck \/ IsMarkDelete \/ IsAdvance
    \/ /\ \/ IsResetBegin \/ IsResetInvalidate \/ IsResetMarkDelete \/ IsResetClear \/ IsResetEnd
       /\ mdFrom = NoPos
       /\ UNCHANGED mdFrom
    \/ /\ \/ IsRStart \/ IsRMarkDelete \/ IsRLookup \/ IsRRecheck \/ IsRLocked \/ IsRFinish
       /\ UNCHANGED mdFrom

TraceNext ==
    \/ /\ l <= LastOf[t]
       /\ StepMatches
       /\ l' = l + 1
       /\ UNCHANGED t
    \/ /\ l > LastOf[t]          \* run fully matched: stutter
       /\ UNCHANGED <<vars, t, l, mdFrom>>

TraceSpec == TraceInit /\ [][TraceNext]_<<vars, t, l, mdFrom>>

(* Every line of every run is matched by a spec step.                      *)
TraceFollowed == l <= LastOf[t] => ENABLED (StepMatches /\ l' = l + 1 /\ UNCHANGED t)

(* A run does not end between an explicit mark-delete and its Advance.     *)
MarkDeleteAdvanced == l > LastOf[t] => mdFrom = NoPos

(* A state recovered after a restart holds what its cursor persisted last  *)
(* before it: the Open naming `pred` equals run pred's last Persist line   *)
(* (checked in the run's initial state, where l is the Open line, so the  *)
(* search of the log for pred's Persist lines runs once per run).          *)
RecoveredAsPersisted ==
    l = FirstOf[t] /\ "pred" \in DOMAIN Log[l] => AsPersisted(Log[l])
=============================================================================
