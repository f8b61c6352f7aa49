// Package server speaks Disque's client protocol (RESP2 over TCP, inline
// commands too) on top of a queue.Broker. It parses arguments, formats
// replies and maps errors; no job logic lives here. shared/SPEC.md is the
// contract: reply shapes and error strings match it word for word, because
// existing Disque clients parse them.
//
// Commands are dispatched through one table (mux.go), one handler per
// command, files by family: cmd_job.go (ADDJOB, GETJOB, ACKJOB, …),
// cmd_queue.go (QLEN, QPEEK, PAUSE), cmd_admin.go (PING, INFO, HELLO,
// CLUSTER, DEBUG, …). Errors from the broker become RESP errors in one
// place, errors.go.
//
// A pipeline of ADDJOBs read together is committed as one store batch:
// one AOF write and one index batch serve them all, and their replies go
// out in order once the batch is durable.
//
// Until SetBroker is called (the store is still replaying its AOF) every
// command but those marked whileLoading (PING, INFO, QUIT, HELLO, AUTH,
// TIME, CLIENT, COMMAND, …) gets -LOADING.
//
// Security: with Options.RequirePass set, a connection must AUTH before
// anything but AUTH and QUIT (-NOAUTH); passwords are compared in constant
// time. A server listening on a non-loopback address without a password
// refuses non-loopback clients (-DENIED), like Redis's protected mode.
// Limits: MaxClients connections, MaxJobSize bytes of ADDJOB body (checked
// before the job reaches the broker, also inside a pipeline).
//
// A Server is safe for concurrent use; each connection is served by its own
// goroutine.
package server
