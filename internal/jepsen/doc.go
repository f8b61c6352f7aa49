// Package jepsen checks a diskque cluster the way Jepsen checks a database:
// clients run operations against every node while a nemesis kills and
// restarts nodes (and, with a Partitioner, cuts the network), every
// operation is recorded with its invocation and completion time and its
// outcome, and afterwards the history is checked against the cluster's
// guarantees (the cluster contract, issue 15 "A checker"). The processes, the
// clients and the workload live in cmd/diskque-server/jepsen_test.go; this
// package is the part that needs no server: the history model, the
// operation mix, the nemesis schedule and the checks. It uses only the
// standard library.
//
// # History
//
// An Event is one operation: an ADDJOB (Add), a GETJOB (Get) with the jobs
// it delivered, an ACKJOB or FASTACK (Ack), a prober's observation that no
// node holds an acked job any more (Gone), the final scan's finding that a
// node still holds an acked job (Holds), or a nemesis op (Kill, Start,
// Partition, Heal). Its Outcome is OK, Fail (an error reply) or Maybe (no
// reply: the node died under the call). Times are durations since the
// Recorder's origin; a Recorder is safe for concurrent use.
//
// # Rules (Check)
//
//   - Lost: an ADDJOB with RETRY > 0 that replied an id was delivered at
//     least once. An ADDJOB that failed or got no reply is indeterminate:
//     it may or may not be delivered.
//   - Duplicated: a RETRY 0 job, whatever its ADDJOB replied, was delivered
//     at most once. Jobs are named by their body, unique per ADDJOB, so an
//     indeterminate add (no id) is followed too.
//   - DeliveredAfterGone: no GETJOB invoked after a Gone observation of a
//     job delivered it. Gone is defined by observation: the prober asked
//     SHOW on every node, twice at least a second apart, with every node up
//     and no nemesis op in between, and no node held a copy of the job (a
//     dummy ack, acked with no body, is not a copy: it cannot be
//     delivered).
//   - NotCollected: after the drain and the wait for ack GC, no node holds
//     a job whose ACKJOB (or FASTACK) replied.
//   - WrongBody: a delivered job's id and body belong to the same ADDJOB.
//
// Every rule is about one job, so Shrink can reduce a violation to that
// job's events (greedily dropping any whose removal keeps the violation)
// and add the nemesis events within NemesisContext of them; Report prints
// the counts, the seed and each shrunk history.
//
// # Schedule
//
// Schedule plans the whole fault phase ahead from one seeded math/rand/v2
// source (Seeds derives the schedule's and every worker's source from one
// seed), so a seed gives the same faults and the same operation mix;
// only the timing of the real processes differs between runs. A Nemesis
// plans (Next, Recover) against a World and applies its ops (Apply);
// Execute runs a schedule on one goroutine and keeps Faults, the live
// epoch and health that the prober reads. KillNemesis kills one or two
// nodes (never more than MaxDown at once, outside a kill of every node,
// which the next op of the family undoes by starting them all) and
// restarts them on their directories. PartitionNemesis splits off a
// minority of one or two nodes and heals, through a Partitioner.
package jepsen
