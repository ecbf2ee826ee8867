package client

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ChangeOptions select a change stream (GET /{db}/_changes).
type ChangeOptions struct {
	// Tables and Partitions filter (empty: all); Fields projects
	// documents.
	Tables     []string
	Partitions []int
	Fields     []string
	// Version renders documents in that schema version (0: the latest).
	Version int
	// Before adds pre-images to updates and deletes.
	Before bool
	// Transactions adds BEGIN and END events around transactions.
	Transactions bool
	// Since is a token from an earlier event, "now" or "beginning" (the
	// default).
	Since string
	// Heartbeat is how often a partition whose position moved without a
	// matching event says so in a "resolved" event (default 1 s).
	Heartbeat time.Duration
}

func (o *ChangeOptions) query() url.Values {
	q := url.Values{}
	if o == nil {
		return q
	}
	if len(o.Tables) > 0 {
		q.Set("tables", strings.Join(o.Tables, ","))
	}
	if len(o.Fields) > 0 {
		q.Set("fields", strings.Join(o.Fields, ","))
	}
	if len(o.Partitions) > 0 {
		ps := make([]string, len(o.Partitions))
		for i, p := range o.Partitions {
			ps[i] = strconv.Itoa(p)
		}
		q.Set("partitions", strings.Join(ps, ","))
	}
	if o.Version > 0 {
		q.Set("version", strconv.Itoa(o.Version))
	}
	if o.Before {
		q.Set("before", "true")
	}
	if o.Transactions {
		q.Set("transactions", "true")
	}
	if o.Since != "" {
		q.Set("since", o.Since)
	}
	if o.Heartbeat > 0 {
		q.Set("heartbeat", o.Heartbeat.String())
	}
	return q
}

// ChangeEvent is one event of a change stream: a Debezium envelope (Op,
// Before, After, Source, TsMs, Transaction) for Type "change"; Source
// alone (the partition and its SCN) for "resolved" and "rollback"; and
// Status, ID and counts for "transaction" boundaries. Token resumes after
// this event.
type ChangeEvent struct {
	Type        string             `json:"type"`
	Op          string             `json:"op,omitempty"`
	Before      json.RawMessage    `json:"before,omitempty"`
	After       json.RawMessage    `json:"after,omitempty"`
	Source      ChangeSource       `json:"source"`
	TsMs        int64              `json:"ts_ms"`
	Transaction *ChangeTransaction `json:"transaction,omitempty"`
	Status      string             `json:"status,omitempty"`
	ID          string             `json:"id,omitempty"`
	EventCount  *int               `json:"event_count,omitempty"`
	Token       string             `json:"token"`
	// Raw is the event as the server sent it; Before and After may be
	// slices of it (copy one before changing it).
	Raw json.RawMessage `json:"-"`
}

// ChangeTransaction places a change in its transaction (Debezium's
// transaction block): ID is "partition/SCN" (46/1:2), unique in the
// database, as the SCN alone is only in its partition.
type ChangeTransaction struct {
	ID                  string `json:"id"`
	TotalOrder          int    `json:"total_order"`
	DataCollectionOrder int    `json:"data_collection_order"`
}

// ChangeSource says where an event comes from. For a "rollback" event,
// SCN is where the partition's timeline continues: the consumer undoes
// what it applied of that partition after it.
type ChangeSource struct {
	DB         string `json:"db"`
	Table      string `json:"table,omitempty"`
	Key        Key    `json:"key,omitempty"`
	Partition  int    `json:"partition"`
	SCN        string `json:"scn"`
	Generation uint32 `json:"generation"`
	Sequence   uint64 `json:"sequence"`
	// SchemaVersion is the version a change's Before and After are in
	// (the stream's Version, or the table's latest); of an "error"
	// event, the version the document was written in.
	SchemaVersion int   `json:"schemaVersion,omitempty"`
	TsMs          int64 `json:"ts_ms,omitempty"`
	// Snapshot is "true" or "last" for rows of a snapshot, "false" for
	// changes.
	Snapshot string `json:"snapshot,omitempty"`
}

// Changes iterates over a database's change stream until ctx ends or the
// caller stops. It yields only changes acknowledged to their writers,
// which no failover takes back (docs/change-stream.md). When the connection breaks it reconnects, resuming after
// the last event's token, with a growing pause (up to 5 s); an error the
// server states (a bad request, an unknown database, or mid-stream a
// change it cannot render in the asked version: an "error" event) ends
// the iteration with that error, as does the end of ctx. A deadline of ctx goes to the
// server too (Request-Timeout), which ends the stream then.
func (c *Client) Changes(ctx context.Context, db string, o *ChangeOptions) iter.Seq2[*ChangeEvent, error] {
	return func(yield func(*ChangeEvent, error) bool) {
		q := o.query()
		pause := 100 * time.Millisecond
		stopped := errors.New("stopped")
		for {
			var failed *Error
			err := c.t.Changes(ctx, db, q, func(line []byte) error {
				e, err := decodeEvent(line)
				if err != nil {
					return err
				}
				if e.Type == "error" {
					// The stream met a change it cannot render as asked:
					// reconnecting would meet it again.
					failed = changeError(line)
					return stopped
				}
				if e.Token != "" {
					q.Set("since", e.Token)
				}
				pause = 100 * time.Millisecond
				if !yield(e, nil) {
					return stopped
				}
				return nil
			})
			if failed != nil {
				yield(nil, failed)
				return
			}
			if errors.Is(err, stopped) {
				return
			}
			var se *Error
			if ctx.Err() != nil || errors.As(err, &se) && se.Status < 500 {
				if ctx.Err() != nil {
					err = ctx.Err()
				}
				yield(nil, err)
				return
			}
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				yield(nil, ctx.Err())
				return
			case <-t.C:
			}
			pause = min(2*pause, 5*time.Second)
		}
	}
}

// changeError is the problem an "error" event of the stream carries.
func changeError(line []byte) *Error {
	var v struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(line, &v) != nil || v.Error == nil {
		return &Error{Status: 500, Type: "urn:cortado:problem:internal", Title: "Change stream failed", Detail: string(line[:min(len(line), 512)])}
	}
	return v.Error
}
