// Package schema owns everything Cortado knows about Avro documents: parsing
// table schemas, deciding whether a new version is compatible with the last
// (both ways, with the offending field named), turning JSON into validated
// Avro binary, writing Avro binary as JSON, building projected reader schemas
// from dot paths, and resolution plans that turn bytes written with one
// schema version into bytes of another version or of a projection.
//
// It is pure: it never talks to etcd, Pebble or the network. Plans are built
// once per (writer, reader) pair, cached, and shared by all goroutines.
//
// Never decode bytes with a schema other than the one they were written with:
// Avro binary carries no field tags, so reading old bytes with a new schema
// without a plan silently yields garbage. Every read goes through a Plan.
package schema
