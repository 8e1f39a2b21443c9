"""Each rank's training step as a program: an ordered list of typed actions (pure data, no MPI).

The planner says *what* each rank holds and which exchanges connect the parts
(:mod:`singa_mpi.planner.plan`); a program says *in which order* a rank computes, communicates,
waits and hands its gradients to the sync strategy, for one phase and one algorithm:

* :mod:`.actions`: the vocabulary (compute a layer's pass, one communication call, a wait, ...);
* :mod:`.rules`: the rules every reader of a program shares, defined once (tags, roots, ring bytes);
* :mod:`.units`: a rank's part of a plan (or a serial net) as the builders see it;
* :mod:`.passes`: the passes of BP, BPTT and CD over units (train, test, validation), with the
  calls of the connection layers they meet;
* :mod:`.build`: a rank's whole program from a plan: the passes, then in training the sync
  strategy's calls, the waits and the update;
* :mod:`.verify`: the proof that the ranks' programs pair up and cannot deadlock;
* :mod:`.execute`: runs a program's passes on a net (every runtime, every algorithm).

The pre-flight proof and digest, the communication table's prediction and the ``plan`` printout
(:mod:`singa_mpi.planner.schedule`) and the cost model's step (:mod:`singa_mpi.cost.model`) read the
same programs.  Not in a program: what several worker
groups do between them (a server answers whichever worker's message comes first; distributed
Hogwild's groups exchange their changes every ``sync_freq`` steps), which is no fixed per-step
order.
"""
