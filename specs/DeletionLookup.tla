--------------------------- MODULE DeletionLookup ---------------------------
(***************************************************************************)
(* A subscription's cursor deletion state (Pulsar's ManagedCursorImpl:    *)
(* mark-delete + individually deleted ranges; pulsar-core's src/deletion)    *)
(* and its lock-free read-scheduling hint, which the dispatcher asks to   *)
(* skip reading acknowledged entries. It protects: a "deleted" answer is  *)
(* never stale after a reset (a seek or rewind) that already completed.   *)
(*                                                                         *)
(* Authoritative state (guarded by the cursor write lock): the mark-delete *)
(* position md and an ordered map ledger -> bitmap object. Bitmap objects *)
(* are shared by reference with the PUBLISHED directory dir, which is      *)
(* republished only when an ack creates a bitmap for a ledger, and         *)
(* invalidated (emptied) by reset. Reset may move md backward and clears   *)
(* the map, bracketed by an odd/even epoch. An explicit mark-delete (a     *)
(* cumulative ack) moves md forward past entries that are not deleted.    *)
(*                                                                         *)
(* The reader (is_deleted_for_read_scheduling) is split into its real     *)
(* steps: load epoch, load md, load dir entry, read the bitmap, re-check  *)
(* the epoch (fall back to the locked check when odd or changed).          *)
(*                                                                         *)
(* Summary slots: the implementation keeps the bitmaps of up to four     *)
(* ledgers in permanent slots that readers find without loading the      *)
(* published directory, i.e. they reach the LIVE map's bitmap of the      *)
(* ledger. RDirectory therefore picks either the published entry or the   *)
(* live map's. A slot bitmap reused for another ledger is emptied and     *)
(* re-tagged inside a version bracket and the reader validates the tag    *)
(* and the version, so reuse reads as an empty bitmap; the model gives    *)
(* every bitmap a fresh id instead.                                        *)
(*                                                                         *)
(* The bitmap read (RBits) is one bit read at one instant: the code reads *)
(* a lock-free mirror word of the bitmap and keeps a "deleted" only if no *)
(* clear or re-tag overlapped the read (a seqlock per bitmap, checked by  *)
(* loom; the roaring bitmap under a try-lock above the mirror's entries). *)
(*                                                                         *)
(* Not modelled: the lock-free filters (empty-directory count, unslotted  *)
(* count, min/max bounds), a mirror read that a clear overlapped or a     *)
(* try-lock that finds a writer (both answer "not deleted"), and the      *)
(* republish on ledger removal. Each can only turn a lookup into "not     *)
(* deleted" (a stale negative) or skip nothing; every "deleted" answer    *)
(* still comes from md or a bitmap read modelled here.                    *)
(*                                                                         *)
(* ExplicitMarkDelete = TRUE : writers also mark-delete explicitly (a      *)
(*                        cumulative ack past entries not deleted).        *)
(*                                                                         *)
(* Switches (negative controls):                                           *)
(*   EpochCheck = FALSE : no epoch re-check (the lookup returns whatever   *)
(*                        it computed).                                    *)
(*   AtomicMD   = FALSE : md read as two separate atomics (entry, then     *)
(*                        ledger), so a forward advance can be torn.       *)
(***************************************************************************)
EXTENDS Naturals, Integers, FiniteSets

CONSTANTS NumLedgers,   \* ledgers 1..NumLedgers (DefaultLastEntry)
          MaxEntry,     \* entry ids are at most MaxEntry
          LastEntry,    \* ledger id -> its last entry id (-1: empty ledger)
          MaxResets,    \* resets the model performs at most
          MaxIds,       \* bitmap objects the model allocates at most
          ResetTo,      \* the mark-delete a reset moves to (backward)
          ExplicitMarkDelete, \* BOOLEAN: writers also mark-delete explicitly
          EpochCheck,   \* BOOLEAN: reader re-checks the epoch (the fix)
          AtomicMD      \* BOOLEAN: md is read as one snapshot (the fix)

\* The backward reset target the cfgs use (TLC's cfg syntax has neither
\* tuples nor negative numbers, so cfgs write `ResetTo <- ResetToBeforeLedger1`).
ResetToBeforeLedger1 == <<1, -1>>

\* The model's ledger layout (cfgs write `LastEntry <- DefaultLastEntry`):
\* ledgers 1..NumLedgers, each holding entries 0..MaxEntry. Trace
\* validation replaces it with the layout of the managed ledger recorded.
DefaultLastEntry == [l \in 1..NumLedgers |-> MaxEntry]

VARIABLES md,      \* mark-delete position <<ledger, entry>>
          bm,      \* bitmap object id -> set of entry ids (live, shared)
          map,     \* authoritative ledger -> bitmap id (NoId = none)
          dir,     \* published directory ledger -> bitmap id
          nextId,  \* next fresh bitmap object id
          epoch,   \* reset epoch: odd while a reset is in progress
          resets,  \* resets started so far
          writer,  \* "none" or "reset" (reset holds the write lock)
          pc,      \* reader program counter
          q,       \* position the reader looks up
          e1,      \* epoch read on entry
          rmd,     \* md snapshot read
          rid,     \* bitmap id read from the directory
          ans      \* answer computed / returned

vars == <<md, bm, map, dir, nextId, epoch, resets, writer, pc, q, e1, rmd, rid, ans>>

Ledgers == DOMAIN LastEntry
Entries == 0..MaxEntry                       \* every LastEntry[l] <= MaxEntry
Ids == 1..MaxIds
NoId == 0
Positions == UNION {{l} \X (-1..LastEntry[l]) : l \in Ledgers}  \* with the (L,-1) bounds
Members == UNION {{l} \X (0..LastEntry[l]) : l \in Ledgers}     \* positions holding entries

Leq(a, b) == (a[1] < b[1]) \/ ((a[1] = b[1]) /\ (a[2] <= b[2]))
Less(a, b) == Leq(a, b) /\ (a /= b)

InMap(p) == (map[p[1]] /= NoId) /\ (p[2] \in bm[map[p[1]]])

\* The authoritative "deleted" predicate (is_message_deleted).
Deleted(p) == Leq(p, md) \/ InMap(p)

Init ==
    /\ md = <<1, -1>>
    /\ bm = [i \in Ids |-> {}]
    /\ map = [l \in Ledgers |-> NoId]
    /\ dir = [l \in Ledgers |-> NoId]
    /\ nextId = 1
    /\ epoch = 0
    /\ resets = 0
    /\ writer = "none"
    /\ pc = "idle"
    /\ q = <<1, 0>>
    /\ e1 = 0
    /\ rmd = <<1, -1>>
    /\ rid = NoId
    /\ ans = FALSE

readerVars == <<pc, q, e1, rmd, rid, ans>>

(* Writers never act in the instant the reader returns: "done" is the     *)
(* return point at which NoStalePositive is evaluated.                     *)
WriterMayAct == writer = "none" /\ pc /= "done"

(* Grouped ack of one position under the write lock: adds the bit to the  *)
(* ledger's live bitmap; a new bitmap object republishes the directory.   *)
Ack(p) ==
    /\ WriterMayAct
    /\ ~Deleted(p)
    /\ IF map[p[1]] /= NoId
         THEN /\ bm' = [bm EXCEPT ![map[p[1]]] = @ \cup {p[2]}]
              /\ UNCHANGED <<map, dir, nextId>>
         ELSE /\ nextId <= MaxIds
              /\ bm' = [bm EXCEPT ![nextId] = {p[2]}]
              /\ map' = [map EXCEPT ![p[1]] = nextId]
              /\ dir' = [map EXCEPT ![p[1]] = nextId]
              /\ nextId' = nextId + 1
    /\ UNCHANGED <<md, epoch, resets, writer>>
    /\ UNCHANGED readerVars

NoPos == <<-1, -1>>

\* The entry right after position c, or NoPos if none does.
NextMember(c) ==
    LET later == {k \in Ledgers : k > c[1] /\ LastEntry[k] >= 0}
    IN IF c[2] < LastEntry[c[1]] THEN <<c[1], c[2] + 1>>
       ELSE IF later = {} THEN NoPos
       ELSE <<CHOOSE k \in later : \A k2 \in later : k <= k2, 0>>

\* As far as the deleted run right after position a reaches: its last
\* entry, or a itself when the entry after a is not deleted (the code's
\* run ends are entries: the upper bounds of deleted ranges).
RECURSIVE RunEnd(_)
RunEnd(a) ==
    IF NextMember(a) /= NoPos /\ InMap(NextMember(a)) THEN RunEnd(NextMember(a)) ELSE a

(* The mark-delete moves forward to c, one write section: md (one atomic  *)
(* published snapshot) is stored, THEN the set is trimmed                  *)
(* (remove_at_most(md)): bits <= md leave the live bitmaps, empty bitmaps *)
(* leave the map; the directory is NOT republished.                       *)
MoveMarkDelete(c) ==
    /\ md' = c
    /\ LET live == {map[l] : l \in {l2 \in Ledgers : map[l2] /= NoId}}
           owner(i) == CHOOSE l \in Ledgers : map[l] = i
           kept(i) == {e \in bm[i] : ~Leq(<<owner(i), e>>, c)}
       IN /\ bm' = [i \in Ids |-> IF i \in live THEN kept(i) ELSE bm[i]]
          /\ map' = [l \in Ledgers |->
                       IF map[l] /= NoId /\ kept(map[l]) = {} THEN NoId ELSE map[l]]
    /\ UNCHANGED <<dir, nextId, epoch, resets, writer>>
    /\ UNCHANGED readerVars

(* Mark-delete advance after acks: md moves through every contiguous      *)
(* deleted entry after it.                                                 *)
Advance(c) ==
    /\ WriterMayAct
    /\ c /= md
    /\ c = RunEnd(md)
    /\ MoveMarkDelete(c)

(* Explicit mark-delete to t (a cumulative ack; t may lie past entries    *)
(* that are not deleted), extended through the deleted run after t.       *)
MarkDelete(t, c) ==
    /\ WriterMayAct
    /\ t \in Positions
    /\ Less(md, t)
    /\ c = RunEnd(t)
    /\ MoveMarkDelete(c)

(* Reset, under the write lock, in its real steps.                        *)
ResetBegin ==
    /\ WriterMayAct
    /\ resets < MaxResets
    /\ writer' = "reset"
    /\ epoch' = epoch + 1
    /\ resets' = resets + 1
    /\ UNCHANGED <<md, bm, map, dir, nextId>>
    /\ UNCHANGED readerVars

ResetInvalidate ==
    /\ writer = "reset" /\ pc /= "done"
    /\ dir' = [l \in Ledgers |-> NoId]
    /\ UNCHANGED <<md, bm, map, nextId, epoch, resets, writer>>
    /\ UNCHANGED readerVars

ResetMarkDelete(t) ==
    /\ writer = "reset" /\ pc /= "done"
    /\ \A l \in Ledgers : dir[l] = NoId
    /\ md' = t
    /\ UNCHANGED <<bm, map, dir, nextId, epoch, resets, writer>>
    /\ UNCHANGED readerVars

ResetClear ==
    /\ writer = "reset" /\ pc /= "done"
    /\ \A l \in Ledgers : dir[l] = NoId
    /\ map' = [l \in Ledgers |-> NoId]    \* old bitmap objects keep their bits
    /\ writer' = "reset-end"
    /\ UNCHANGED <<md, bm, dir, nextId, epoch, resets>>
    /\ UNCHANGED readerVars

ResetEnd ==
    /\ writer = "reset-end" /\ pc /= "done"
    /\ epoch' = epoch + 1
    /\ writer' = "none"
    /\ UNCHANGED <<md, bm, map, dir, nextId, resets>>
    /\ UNCHANGED readerVars

(* Reader step 1: pick a position, load the epoch; odd -> locked check.   *)
RStart(p) ==
    /\ pc = "idle"
    /\ q' = p
    /\ e1' = epoch
    /\ pc' = IF epoch % 2 = 1 THEN "locked"
             ELSE IF AtomicMD THEN "md" ELSE "mdEntry"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, rmd, rid, ans>>

(* Reader step 2: md as ONE snapshot.                                     *)
RMarkDelete ==
    /\ pc = "md"
    /\ rmd' = md
    /\ pc' = "dir"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rid, ans>>

(* Torn variant: entry half first, ledger half later (two atomics).       *)
RMarkDeleteEntry ==
    /\ pc = "mdEntry"
    /\ rmd' = <<1, md[2]>>
    /\ pc' = "mdLedger"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rid, ans>>

RMarkDeleteLedger ==
    /\ pc = "mdLedger"
    /\ rmd' = <<md[1], rmd[2]>>
    /\ pc' = "dir"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rid, ans>>

(* Reader step 3: compare with md; else find the ledger's bitmap: in the  *)
(* published directory, or (summary slot) the live map's bitmap.          *)
RDirectory ==
    /\ pc = "dir"
    /\ IF Leq(q, rmd)
         THEN /\ ans' = TRUE
              /\ pc' = "recheck"
              /\ UNCHANGED rid
         ELSE /\ \E r \in {dir[q[1]], map[q[1]]} : rid' = r
              /\ pc' = "bits"
              /\ UNCHANGED ans
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rmd>>

(* Reader step 4: contains() on the live bitmap (one validated bit read). *)
RBits ==
    /\ pc = "bits"
    /\ ans' = (rid /= NoId /\ q[2] \in bm[rid])
    /\ pc' = "recheck"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rmd, rid>>

(* Reader step 5: acquire fence + epoch re-read; odd/changed -> locked.   *)
RRecheck ==
    /\ pc = "recheck"
    /\ pc' = IF EpochCheck /\ epoch /= e1 THEN "locked" ELSE "done"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rmd, rid, ans>>

(* Fallback: is_message_deleted under the read lock (waits for reset).    *)
RLocked ==
    /\ pc = "locked"
    /\ writer = "none"
    /\ ans' = Deleted(q)
    /\ pc' = "done"
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer, q, e1, rmd, rid>>

(* The answer has been returned; the reader starts over.                  *)
RFinish ==
    /\ pc = "done"
    /\ pc' = "idle"
    /\ q' = <<1, 0>>
    /\ e1' = 0
    /\ rmd' = <<1, -1>>
    /\ rid' = NoId
    /\ ans' = FALSE
    /\ UNCHANGED <<md, bm, map, dir, nextId, epoch, resets, writer>>

Next ==
    \/ \E p \in Members : Ack(p)
    \/ Advance(RunEnd(md))
    \/ ExplicitMarkDelete /\ \E t \in Positions : MarkDelete(t, RunEnd(t))
    \/ ResetBegin
    \/ ResetInvalidate
    \/ ResetMarkDelete(ResetTo)
    \/ ResetClear
    \/ ResetEnd
    \/ \E p \in Members : RStart(p)
    \/ RMarkDelete
    \/ RMarkDeleteEntry
    \/ RMarkDeleteLedger
    \/ RDirectory
    \/ RBits
    \/ RRecheck
    \/ RLocked
    \/ RFinish

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ md \in Positions
    /\ bm \in [Ids -> SUBSET Entries]
    /\ map \in [Ledgers -> Ids \cup {NoId}]
    /\ dir \in [Ledgers -> Ids \cup {NoId}]
    /\ epoch \in 0..(2 * MaxResets)
    /\ writer \in {"none", "reset", "reset-end"}
    /\ pc \in {"idle", "md", "mdEntry", "mdLedger", "dir", "bits", "recheck", "locked", "done"}

(* The contract: when the hint returns "deleted", the position IS deleted *)
(* at that instant (a stale "not deleted" is allowed, a stale "deleted"   *)
(* would make the read loop skip an undelivered message).                 *)
NoStalePositive == (pc = "done" /\ ans) => Deleted(q)

(* The epoch is odd exactly while a reset holds the write lock.           *)
EpochOddIffResetting == (epoch % 2 = 1) <=> (writer /= "none")
=============================================================================
