---------------------------- MODULE LedgerCursor ----------------------------
(***************************************************************************)
(* The managed-ledger cursor of pulsar-core's substrate (src/ledger):      *)
(* entries are appended to a log, a cursor reads forward from its read     *)
(* position (plain reads, or reads that skip entries the caller declares   *)
(* deleted and return the first run of entries it keeps), acknowledges a  *)
(* prefix with mark-delete, rewinds to the first entry after the          *)
(* mark-delete position, is reset to any position (a seek: the mark-delete *)
(* moves to just before it, in either direction), and is recovered after  *)
(* a restart from its persisted mark-delete.                               *)
(*                                                                         *)
(* Positions are flattened to 0..MaxEntries-1 (ledger rollover only        *)
(* renumbers them); -1 is "nothing acknowledged".                          *)
(*                                                                         *)
(* RewindToMarkDelete is the negative-control switch: TRUE models a rewind *)
(* that lands ON the mark-delete position instead of the entry after it,  *)
(* re-delivering an acknowledged entry.                                    *)
(***************************************************************************)
EXTENDS Naturals, Integers

CONSTANTS MaxEntries,          \* entries the model appends at most
          MaxBatch,            \* largest read batch
          RewindToMarkDelete   \* BOOLEAN: the bug switch (see above)

VARIABLES lce,       \* last confirmed entry (-1 when the log is empty)
          md,        \* mark-delete position: every entry <= md is acknowledged
          read,      \* next entry a read returns
          delivered, \* entries returned by reads since the last rewind
          rewound,   \* TRUE right after a Rewind or Recover step
          reset      \* TRUE right after a Reset step

vars == <<lce, md, read, delivered, rewound, reset>>

Init ==
    /\ lce = -1
    /\ md = -1
    /\ read = 0
    /\ delivered = {}
    /\ rewound = FALSE
    /\ reset = FALSE

Min(a, b) == IF a < b THEN a ELSE b
Max0(x) == IF x < 0 THEN 0 ELSE x

\* A producer appends one entry.
AppendEntry ==
    /\ lce < MaxEntries - 1
    /\ lce' = lce + 1
    /\ rewound' = FALSE
    /\ reset' = FALSE
    /\ UNCHANGED <<md, read, delivered>>

(* read_entries(k): returns entries read..min(read+k-1, lce), moves read. *)
Read(k) ==
    /\ read <= lce
    /\ LET last == Min(read + k - 1, lce) IN
        /\ delivered' = delivered \cup (read..last)
        /\ read' = last + 1
    /\ rewound' = FALSE
    /\ reset' = FALSE
    /\ UNCHANGED <<lce, md>>

(* read_entries_with_skip: the entries read..first-1 were passed over;    *)
(* first..last is the run returned (at most MaxBatch). Which entries the  *)
(* caller declared deleted is not modelled: the spec cannot tell a pass-  *)
(* over of an undeleted entry from a correct skip (the model test and the  *)
(* DeletionLookup spec cover that).                                        *)
ReadRun(first, last) ==
    /\ read <= first
    /\ first <= last
    /\ last <= lce
    /\ last - first + 1 <= MaxBatch
    /\ delivered' = delivered \cup (first..last)
    /\ read' = last + 1
    /\ rewound' = FALSE
    /\ reset' = FALSE
    /\ UNCHANGED <<lce, md>>

(* read_entries_with_skip passed over a window without returning any (or  *)
(* a plain read with auto-skip passed a lost ledger): read moves forward,  *)
(* at most to just past the last confirmed entry. As for ReadRun, what was *)
(* passed over is not checked here.                                        *)
SkipTo(r) ==
    /\ read <= r
    /\ r <= lce + 1
    /\ read' = r
    /\ rewound' = FALSE
    /\ reset' = FALSE
    /\ UNCHANGED <<lce, md, delivered>>

(* mark_delete(p): only forward, only up to lce; pushes read past p. *)
MarkDelete(p) ==
    /\ p >= md
    /\ p <= lce
    /\ md' = p
    /\ read' = IF read <= p THEN p + 1 ELSE read
    /\ rewound' = FALSE
    /\ reset' = FALSE
    /\ UNCHANGED <<lce, delivered>>

(* rewind(): read := next(mark-delete). The bug lands on mark-delete. *)
Rewind ==
    /\ read' = IF RewindToMarkDelete THEN Max0(md) ELSE md + 1
    /\ delivered' = {}
    /\ rewound' = TRUE
    /\ reset' = FALSE
    /\ UNCHANGED <<lce, md>>

(* reset(p) (a seek): reading starts at r, the mark-delete moves to just   *)
(* before it, forward or backward.                                         *)
Reset(r) ==
    /\ r <= lce + 1
    /\ md' = r - 1
    /\ read' = r
    /\ delivered' = {}
    /\ rewound' = FALSE
    /\ reset' = TRUE
    /\ UNCHANGED lce

(* The cursor is recovered after a restart: the persisted mark-delete is  *)
(* kept and reading starts after it (what a reader delivered is gone).     *)
Recover ==
    /\ read' = md + 1
    /\ delivered' = {}
    /\ rewound' = TRUE
    /\ reset' = FALSE
    /\ UNCHANGED <<lce, md>>

Next ==
    \/ AppendEntry
    \/ \E k \in 1..MaxBatch : Read(k)
    \/ \E f, g \in 0..(MaxEntries - 1) : ReadRun(f, g)
    \/ \E r \in 0..MaxEntries : SkipTo(r)
    \/ \E p \in -1..(MaxEntries - 1) : MarkDelete(p)
    \/ Rewind
    \/ \E r \in 0..MaxEntries : Reset(r)
    \/ Recover

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ lce \in -1..(MaxEntries - 1)
    /\ md \in -1..(MaxEntries - 1)
    /\ read \in 0..MaxEntries
    /\ delivered \subseteq 0..(MaxEntries - 1)
    /\ rewound \in BOOLEAN
    /\ reset \in BOOLEAN

(* The read position is always strictly after the mark-delete position.   *)
ReadAfterMarkDelete == read > md

(* Mark-delete never passes the last confirmed entry.                       *)
MarkDeleteConfirmed == md <= lce

(* A rewind or a recovery lands exactly on next(mark-delete).               *)
RewindLandsOnNext == rewound => read = md + 1

(* Mark-delete is monotone: no step but a reset (a seek) moves it backward. *)
(* MarkDelete's own guard implies it; the property states the rule for    *)
(* every action, so a new action that breaks it is reported.               *)
MarkDeleteMonotone == [][reset' \/ md' >= md]_vars
=============================================================================
