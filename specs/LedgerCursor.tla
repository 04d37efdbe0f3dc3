---------------------------- MODULE LedgerCursor ----------------------------
(***************************************************************************)
(* The managed-ledger cursor of pulsar-core's substrate (src/ledger):      *)
(* entries are appended to a log, a cursor reads forward from its read     *)
(* position, acknowledges a prefix with mark-delete, and rewinds to the    *)
(* first entry after the mark-delete position.                             *)
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
          rewound    \* TRUE right after a Rewind step

vars == <<lce, md, read, delivered, rewound>>

Init ==
    /\ lce = -1
    /\ md = -1
    /\ read = 0
    /\ delivered = {}
    /\ rewound = FALSE

Min(a, b) == IF a < b THEN a ELSE b
Max0(x) == IF x < 0 THEN 0 ELSE x

\* A producer appends one entry.
AppendEntry ==
    /\ lce < MaxEntries - 1
    /\ lce' = lce + 1
    /\ rewound' = FALSE
    /\ UNCHANGED <<md, read, delivered>>

(* read_entries(k): returns entries read..min(read+k-1, lce), moves read. *)
Read(k) ==
    /\ read <= lce
    /\ LET last == Min(read + k - 1, lce) IN
        /\ delivered' = delivered \cup (read..last)
        /\ read' = last + 1
    /\ rewound' = FALSE
    /\ UNCHANGED <<lce, md>>

(* mark_delete(p): only forward, only up to lce; pushes read past p. *)
MarkDelete(p) ==
    /\ p >= md
    /\ p <= lce
    /\ md' = p
    /\ read' = IF read <= p THEN p + 1 ELSE read
    /\ rewound' = FALSE
    /\ UNCHANGED <<lce, delivered>>

(* rewind(): read := next(mark-delete). The bug lands on mark-delete. *)
Rewind ==
    /\ read' = IF RewindToMarkDelete THEN Max0(md) ELSE md + 1
    /\ delivered' = {}
    /\ rewound' = TRUE
    /\ UNCHANGED <<lce, md>>

Next ==
    \/ AppendEntry
    \/ \E k \in 1..MaxBatch : Read(k)
    \/ \E p \in -1..(MaxEntries - 1) : MarkDelete(p)
    \/ Rewind

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ lce \in -1..(MaxEntries - 1)
    /\ md \in -1..(MaxEntries - 1)
    /\ read \in 0..MaxEntries
    /\ delivered \subseteq 0..(MaxEntries - 1)
    /\ rewound \in BOOLEAN

(* The read position is always strictly after the mark-delete position.   *)
ReadAfterMarkDelete == read > md

(* Mark-delete never passes the last confirmed entry.                       *)
MarkDeleteConfirmed == md <= lce

(* A rewind lands exactly on next(mark-delete).                             *)
RewindLandsOnNext == rewound => read = md + 1

(* Mark-delete is monotone: no step moves it backward.                      *)
MarkDeleteMonotone == [][md' >= md]_vars
=============================================================================
