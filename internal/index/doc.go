// Package index owns Cortado's local secondary indexes above the storage
// engine: turning a document into its index entries (terms of the fields
// its schema version annotates with "index", words and their positions
// for text fields), the query language (a Lucene-like syntax, parsed with
// errors that point at the offending character), the planner (a pure
// function from a query and the table's index metadata to a plan that
// reads the most selective posting list first and probes, rather than
// reads, a list far larger than its candidates), and running a plan over
// one collection's postings with roaring bitmaps of document ordinals,
// BM25 scores, sorting and paging.
//
// Storage owns where entries live and writes them in the same batch as
// the document change (storage.Indexer, storage.IndexReader); this
// package never writes to Pebble, never talks to the network, and derives
// entries only from a document and its own schema version, so every
// replica indexes a commit the same way.
package index
