------------------------- MODULE PermitConservation -------------------------
(***************************************************************************)
(* PIP-491 permit conservation across broker-consumer incarnations         *)
(* (pulsar-core src/permits): the client returns exactly the permits P    *)
(* each message used, to exactly the incarnation that was debited.        *)
(*                                                                         *)
(* One client consumer id on one connection. Each Subscribe starts a new   *)
(* incarnation 1..MaxInc with a receiver queue of RQ permits. The broker   *)
(* debits P per command (balances may go negative); the client settles     *)
(* each command through its budget (d messages handed off, P - d returned  *)
(* by the command itself), the application returns one permit per         *)
(* dequeued message into the incarnation's accumulator, the accumulator    *)
(* drains into a Flow request at RQ \div 2, and the connection task writes *)
(* the Flow only if the request's incarnation is still current.            *)
(*                                                                         *)
(* Channels are FIFO. Every Flow carries, as a ghost tag, the incarnation  *)
(* whose credit it is; the broker cannot see the tag and credits whatever  *)
(* consumer currently holds the consumer id.                               *)
(*                                                                         *)
(* Bug switches (negative controls):                                       *)
(*   BugNoRevalidate  the connection task writes queued Flow requests      *)
(*                    without re-checking the incarnation, so stale credit *)
(*                    can follow the replacement's Subscribe;              *)
(*   BugSharedState   one accumulator shared by all incarnations: returns  *)
(*                    of messages of a replaced incarnation credit the     *)
(*                    current one.                                         *)
(***************************************************************************)
EXTENDS Naturals, Integers, Sequences

CONSTANTS RQ,              \* receiver queue size (permits per incarnation)
          MaxP,            \* largest P of one command
          MaxInc,          \* incarnations the model creates at most
          BugNoRevalidate, \* BOOLEAN, see above
          BugSharedState   \* BOOLEAN, see above

VARIABLES inc,      \* client: current incarnation
          bInc,     \* broker: incarnation of the registered consumer, 0 = none
          bPermits, \* broker: available permits per incarnation (may be < 0)
          down,     \* broker -> client commands: [i, p], FIFO
          downSum,  \* ghost: Sigma p in down per incarnation
          held,     \* client: handed-off messages not yet dequeued, per incarnation
          acc,      \* client: accumulator per incarnation
          pend,     \* client: Flow requests for the connection task: [i, n]
          pendSum,  \* ghost: Sigma n in pend per incarnation
          chan,     \* client -> broker frames: [t, i, n], FIFO
          chanSum,  \* ghost: Sigma n of Flow frames in chan per incarnation tag
          crossed   \* ghost: the broker applied a Flow to another incarnation

vars == <<inc, bInc, bPermits, down, downSum, held, acc, pend, pendSum,
          chan, chanSum, crossed>>

Incs == 1..MaxInc
Threshold == RQ \div 2
Bump(f, i, d) == [f EXCEPT ![i] = @ + d]
Zero == [i \in Incs |-> 0]
Frame(t, i, n) == [t |-> t, i |-> i, n |-> n]

\* A return of incarnation i reaches the current accumulator.
ReturnCounts(i) == (i = inc) \/ BugSharedState

\* The connection task may write a Flow request tagged i.
WriteAllowed(i) == (i = inc) \/ BugNoRevalidate

\* Applying a Flow tagged i to the registered consumer crosses incarnations.
Crosses(i) == (bInc # 0) /\ (bInc # i)

Init ==
    /\ inc = 1
    /\ bInc = 0
    /\ bPermits = Zero
    /\ down = <<>>
    /\ downSum = Zero
    /\ held = Zero
    /\ acc = Zero
    /\ pend = <<>>
    /\ pendSum = Zero
    \* Subscribe of incarnation 1, then its initial grant of the whole queue
    /\ chan = << Frame("sub", 1, 0), Frame("flow", 1, RQ) >>
    /\ chanSum = Bump(Zero, 1, RQ)
    /\ crossed = FALSE

(* Broker: Consumer.sendMessages debits the finalised P of one command.    *)
BrokerSend(p) ==
    /\ bInc # 0
    /\ bPermits[bInc] > 0
    /\ bPermits' = Bump(bPermits, bInc, -p)
    /\ down' = Append(down, [i |-> bInc, p |-> p])
    /\ downSum' = Bump(downSum, bInc, p)
    /\ UNCHANGED <<inc, bInc, held, acc, pend, pendSum, chan, chanSum, crossed>>

(* Broker: an asynchronous write failed; the consumer is removed, P is     *)
(* not credited back.                                                      *)
BrokerWriteFailure ==
    /\ bInc # 0
    /\ bInc' = 0
    /\ UNCHANGED <<inc, bPermits, down, downSum, held, acc, pend, pendSum,
                   chan, chanSum, crossed>>

(* Broker: processes the next client frame in order.                       *)
BrokerRecv ==
    /\ chan # <<>>
    /\ LET f == Head(chan) IN
        /\ chan' = Tail(chan)
        /\ CASE f.t = "sub" ->
                  /\ bInc' = f.i
                  /\ bPermits' = [bPermits EXCEPT ![f.i] = 0]
                  /\ UNCHANGED <<chanSum, crossed>>
             [] f.t = "close" ->
                  /\ bInc' = IF bInc = f.i THEN 0 ELSE bInc
                  /\ UNCHANGED <<bPermits, chanSum, crossed>>
             [] OTHER ->
                  \* Flow: credits the consumer registered now (if any)
                  /\ chanSum' = Bump(chanSum, f.i, -f.n)
                  /\ bPermits' = IF bInc # 0 THEN Bump(bPermits, bInc, f.n)
                                 ELSE bPermits
                  /\ crossed' = (crossed \/ Crosses(f.i))
                  /\ UNCHANGED bInc
    /\ UNCHANGED <<inc, down, downSum, held, acc, pend, pendSum>>

(* Client: handles the next command. For the current incarnation the      *)
(* command budget hands off d messages (each returns 1 later) and the      *)
(* command returns P - d (skips, compacted-out, mid-batch failure,         *)
(* corruption); a command of a replaced incarnation is discarded.          *)
ClientReceive ==
    /\ down # <<>>
    /\ LET m == Head(down) IN
        /\ down' = Tail(down)
        /\ downSum' = Bump(downSum, m.i, -m.p)
        /\ IF m.i = inc
             THEN (\E d \in 0..m.p :
                     /\ held' = Bump(held, inc, d)
                     /\ acc' = Bump(acc, inc, m.p - d))
             ELSE UNCHANGED <<held, acc>>
    /\ UNCHANGED <<inc, bInc, bPermits, pend, pendSum, chan, chanSum, crossed>>

(* Application: dequeues a message of incarnation i, returning 1 permit to *)
(* i's state (a no-op if i was replaced, unless the state is shared).      *)
AppReturn(i) ==
    /\ held[i] > 0
    /\ held' = Bump(held, i, -1)
    /\ acc' = IF ReturnCounts(i) THEN Bump(acc, inc, 1) ELSE acc
    /\ UNCHANGED <<inc, bInc, bPermits, down, downSum, pend, pendSum, chan,
                   chanSum, crossed>>

(* Client: the accumulator reached the threshold; swap to 0 and queue a    *)
(* Flow request tagged with the current incarnation.                       *)
Drain ==
    /\ acc[inc] > 0
    /\ acc[inc] >= Threshold
    /\ pend' = Append(pend, [i |-> inc, n |-> acc[inc]])
    /\ pendSum' = Bump(pendSum, inc, acc[inc])
    /\ acc' = [acc EXCEPT ![inc] = 0]
    /\ UNCHANGED <<inc, bInc, bPermits, down, downSum, held, chan, chanSum,
                   crossed>>

(* Client: the application is idle (ClientConnection::flush_residual): the *)
(* current incarnation's residual credit, below the threshold, is swapped  *)
(* to 0 and written as a Flow right away, under the connection lock (so    *)
(* atomically with respect to Replace and to the incarnation check).       *)
FlushResidual ==
    /\ acc[inc] > 0
    /\ chan' = Append(chan, Frame("flow", inc, acc[inc]))
    /\ chanSum' = Bump(chanSum, inc, acc[inc])
    /\ acc' = [acc EXCEPT ![inc] = 0]
    /\ UNCHANGED <<inc, bInc, bPermits, down, downSum, held, pend, pendSum,
                   crossed>>

(* Connection task: revalidates the request's incarnation right before     *)
(* writing the Flow (atomically with respect to Replace).                  *)
ConnTaskWrite ==
    /\ pend # <<>>
    /\ LET r == Head(pend) IN
        /\ pend' = Tail(pend)
        /\ pendSum' = Bump(pendSum, r.i, -r.n)
        /\ IF WriteAllowed(r.i)
             THEN /\ chan' = Append(chan, Frame("flow", r.i, r.n))
                  /\ chanSum' = Bump(chanSum, r.i, r.n)
             ELSE UNCHANGED <<chan, chanSum>>
    /\ UNCHANGED <<inc, bInc, bPermits, down, downSum, held, acc, crossed>>

(* Client: reconnect or close/recreate on the same connection: a new       *)
(* incarnation, CloseConsumer + Subscribe + Flow(RQ) in that order; the    *)
(* old accumulator is abandoned.                                           *)
Replace ==
    /\ inc < MaxInc
    /\ inc' = inc + 1
    /\ acc' = [acc EXCEPT ![inc] = 0]
    /\ chan' = chan \o << Frame("close", inc, 0), Frame("sub", inc + 1, 0),
                          Frame("flow", inc + 1, RQ) >>
    /\ chanSum' = Bump(chanSum, inc + 1, RQ)
    /\ UNCHANGED <<bInc, bPermits, down, downSum, held, pend, pendSum, crossed>>

Next ==
    \/ \E p \in 1..MaxP : BrokerSend(p)
    \/ BrokerWriteFailure
    \/ BrokerRecv
    \/ ClientReceive
    \/ \E i \in Incs : AppReturn(i)
    \/ Drain
    \/ FlushResidual
    \/ ConnTaskWrite
    \/ Replace

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TypeOK ==
    /\ inc \in Incs
    /\ bInc \in 0..MaxInc
    /\ \A i \in Incs : bPermits[i] \in Int
    /\ \A i \in Incs : held[i] \in Nat
    /\ \A i \in Incs : acc[i] \in Nat
    /\ crossed \in BOOLEAN

(* Everything granted to the incarnation that both sides consider current *)
(* is accounted for: broker balance + commands in flight + messages held  *)
(* + accumulator + queued Flow requests + Flows in flight = RQ.           *)
Conservation ==
    (inc = bInc) =>
        bPermits[inc] + downSum[inc] + held[inc] + acc[inc]
            + pendSum[inc] + chanSum[inc] = RQ

(* The broker never holds more credit for a consumer than its queue.      *)
NoExcessCredit == (bInc # 0) => bPermits[bInc] <= RQ

(* No Flow is ever applied to an incarnation other than the one whose     *)
(* credit it carries.                                                     *)
NoStaleCredit == ~crossed
=============================================================================
