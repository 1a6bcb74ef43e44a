// Package concourse makes jetway's targets, and the agents joined to this
// gateway, workers of an unmodified Concourse web node, and serves what
// the web node asks of them. See docs/concourse.md. In the order a
// worker's life goes:
//
//   - Registration (Registrar): each running target this gateway owns,
//     and each agent joined to it, keeps one SSH session to the web
//     node's TSA (forward-worker; TSA), through which the web node
//     reaches the worker's Garden and volume APIs over two forwards made
//     by the SSH connection itself (jetway opens no port); or, where the
//     web node reaches the gateway directly, it is registered through the
//     web node's REST API (REST), jetway listening for those calls and
//     heartbeating the worker itself. Where the web node's URL is known,
//     its worker version is read first (version.go): nothing it would
//     never use is registered.
//   - Lifecycle both ways: the web node landing or retiring a worker ends
//     the registration, which lands the target (or the agent) in jetway;
//     jetway's own land, retire and prune reach the web node as
//     land-worker, retire-worker and delete-worker.
//   - Garbage collection (sweep.go): every round a worker reports the
//     containers and volumes jetway holds for it (Holdings, Pods) and
//     destroys those the web node names, and only those jetway made.
//   - The Garden API (garden.go): containers (Containers), whose spec and
//     properties are kept in the state namespace (ContainerRecords), and
//     their processes (Process), runs of the step agent that outlive a
//     dropped connection and a gateway restart.
//   - The volume (baggageclaim) API (Holder): on a cluster target the
//     volumes live in its volume holder pod, and are moved into a
//     container's pod and back out around each process.
//   - The two kinds of worker behind one interface (workers.go): a
//     cluster target, whose containers are sealed step pods, and an agent
//     joined to this gateway, whose containers are folders on its machine
//     linked to the volumes it keeps. The agent serves its side
//     (agent.LocalWorker); this package reaches it over the mesh (Agents)
//     by the calls written down in wire (wire.LocalWorkerPath), and
//     imports nothing of the agent's.
//   - Metrics (Metrics) of all of the above.
package concourse
