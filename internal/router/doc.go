// Package router owns Cortado's document API: it parses requests (HTTP, or
// typed calls from the embedded client), validates documents against the
// registry's latest schema, computes each key's partition, sends the work to
// the storage node that serves it, merges fan-out results (or streams a
// multi-get's as they come), and renders documents as JSON or Avro. Reads
// that accept staleness may be answered from its hot-key cache
// (internal/keycache), which its writes keep exact for its own clients,
// and, partition by partition, by slaves where a master cannot answer or
// answers slowly (hedged within a budget per slave host; never writes).
//
// It never touches storage directly: every partition is reached through a
// node.Service, which later becomes a network call. Every error leaving the
// package is mapped to an RFC 9457 problem in one place (errors.go).
package router
