package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/cortado-db/cortado/internal/backup"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/index"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// keyError is a key that does not fit the table (400).
type keyError struct{ err error }

func (e *keyError) Error() string { return e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// projectionError is a bad ?fields= path (400).
type projectionError struct{ err error }

func (e *projectionError) Error() string { return e.err.Error() }
func (e *projectionError) Unwrap() error { return e.err }

// bodyError is a request body that could not be read as HTTP (a
// malformed chunked encoding: 400).
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "reading the request body: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// errBodyTimeout is a request body not received within the body timeout
// (408).
var errBodyTimeout = errors.New("the request body did not arrive within the body timeout")

// responseTooLarge is a response over the size limit (413).
type responseTooLarge struct {
	size, limit int
	partial     bool // a page: fewer documents would do
	multiGet    bool // a multi-get's page: fewer keys, or a stream
}

func (e *responseTooLarge) Error() string {
	if e.size <= e.limit {
		return fmt.Sprintf("the documents are %d bytes or more before their conversion to JSON, over the response limit of %d", e.size, e.limit)
	}
	return fmt.Sprintf("response of %d bytes is over the limit of %d", e.size, e.limit)
}

var errAvroMulti = errors.New("avro/binary is served for single documents only; multi-document responses are JSON")
var errLinesMulti = errors.New("application/x-ndjson is served for multi-gets (and the change stream) only; other reads answer application/json")

// ErrNotAcceptable is returned for an Accept header the API cannot serve.
var ErrNotAcceptable = errors.New("not acceptable")

// ErrUnsupportedMedia is returned for a request body type the API cannot read.
var ErrUnsupportedMedia = errors.New("unsupported media type")

// readError is the error of a read that waited for replicas to hold
// what it returns (node.ErrNotReplicated): its problem speaks of a read,
// which may simply be retried, not of a write whose outcome is unknown.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// readFailed marks *err, the error of a read, as a read's.
func readFailed(err *error) {
	if *err != nil && errors.Is(*err, node.ErrNotReplicated) {
		*err = &readError{*err}
	}
}

// Problem maps any error of the document API to its RFC 9457 problem. It
// is the one place where errors become statuses.
func Problem(err error) *problem.Problem {
	var p *problem.Problem
	if errors.As(err, &p) {
		return p
	}
	var le *backup.LineError
	if errors.As(err, &le) {
		return restoreProblem(le)
	}
	pr := toProblem(err)
	var oe *node.OpError
	if errors.As(err, &oe) {
		i := oe.Index
		pr.Operation = &i
	}
	return pr
}

func toProblem(err error) *problem.Problem {
	var (
		fe  *schema.FieldError
		ke  *keyError
		pe  *projectionError
		rt  *responseTooLarge
		ie  *registry.IncompatibleError
		inv *registry.InvalidError
		mbe *http.MaxBytesError
		be  *bodyError
	)
	var ce *changes.RequestError
	var (
		se *index.SyntaxError
		qe *index.QueryError
	)
	switch {
	case errors.As(err, &se):
		p := problem.New(http.StatusBadRequest, problem.TypeInvalidQuery, "Invalid query", se.Error())
		p.Position = &se.Pos
		return p
	case errors.As(err, &qe):
		p := problem.New(http.StatusBadRequest, problem.TypeInvalidQuery, "Invalid query", qe.Error())
		p.Position, p.Field = &qe.Pos, qe.Field
		return p
	case errors.Is(err, node.ErrIndexBuilding):
		p := problem.New(http.StatusConflict, problem.TypeIndexBuilding, "Index building", err.Error())
		p.RetryAfter = 10
		return p
	case errors.Is(err, node.ErrInvalidQuery):
		return problem.New(http.StatusBadRequest, problem.TypeInvalidQuery, "Invalid query", err.Error())
	case errors.Is(err, changes.ErrBadToken):
		return problem.New(http.StatusBadRequest, problem.TypeInvalidToken, "Invalid change-stream token", "the token is not one this database's change stream gave (resume with the token of the last event received, or since=now|beginning)")
	case errors.As(err, &ce):
		return problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed change-stream request", err.Error())
	case errors.As(err, &ie):
		p := problem.New(http.StatusConflict, problem.TypeIncompatibleSchema, "Incompatible schema version", err.Error())
		p.Field = ie.Path
		return p
	case errors.As(err, &inv):
		return problem.New(http.StatusBadRequest, problem.TypeInvalidSchema, "Invalid definition", err.Error())
	case errors.As(err, &pe):
		p := problem.New(http.StatusBadRequest, problem.TypeInvalidProjection, "Invalid projection", err.Error())
		if errors.As(err, &fe) {
			p.Field = fe.Path
		}
		return p
	case errors.As(err, &fe):
		p := problem.New(http.StatusBadRequest, problem.TypeInvalidDocument, "Invalid document", err.Error())
		p.Field = fe.Path
		return p
	case errors.As(err, &ke):
		return problem.New(http.StatusBadRequest, problem.TypeInvalidKey, "Invalid key", err.Error())
	case errors.Is(err, node.ErrBadPatch):
		return problem.New(http.StatusBadRequest, problem.TypeInvalidDocument, "Invalid patch", err.Error())
	case errors.As(err, &mbe):
		return problem.New(http.StatusRequestEntityTooLarge, problem.TypeBodyTooLarge, "Request body too large",
			fmt.Sprintf("request bodies are limited to %d bytes", mbe.Limit))
	case errors.Is(err, registry.ErrSchemaTooLarge):
		return problem.New(http.StatusRequestEntityTooLarge, problem.TypeBodyTooLarge, "Schema too large", err.Error())
	case errors.As(err, &be):
		return problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed request body", be.Error())
	case errors.Is(err, errBodyTimeout):
		return problem.New(http.StatusRequestTimeout, problem.TypeRequestTimeout, "Request body too slow", err.Error())
	case errors.As(err, &rt):
		detail := err.Error() + "; ask for fewer fields with ?fields=a,b.c"
		switch {
		case rt.multiGet:
			detail += ", fewer keys, or the documents one line each as they are read with Accept: application/x-ndjson"
		case rt.partial:
			detail += " or fewer documents with ?limit="
		}
		return problem.New(http.StatusRequestEntityTooLarge, problem.TypeResponseTooLarge, "Response too large", detail)
	case errors.Is(err, registry.ErrNoDatabase):
		return problem.New(http.StatusNotFound, problem.TypeNoDatabase, "No such database", err.Error())
	case errors.Is(err, registry.ErrNoTable):
		return problem.New(http.StatusNotFound, problem.TypeNoTable, "No such table", err.Error())
	case errors.Is(err, registry.ErrNoVersion):
		return problem.New(http.StatusNotFound, problem.TypeNoVersion, "No such schema version", err.Error())
	case errors.Is(err, node.ErrNotFound):
		return problem.New(http.StatusNotFound, problem.TypeNotFound, "Document not found", "no document has this key (it was never written, or was deleted)")
	case errors.Is(err, node.ErrPreconditionFailed):
		return problem.New(http.StatusPreconditionFailed, problem.TypePrecondition, "Precondition failed", "the document's ETag or Last-Modified does not satisfy the request's conditional headers")
	case errors.Is(err, storage.ErrKeysExhausted):
		return problem.New(http.StatusConflict, problem.TypeConflict, "Auto-increment keys exhausted", err.Error()+": nothing was written; insert with an explicit key (PUT)")
	case errors.Is(err, storage.ErrCommitTooLarge):
		return problem.New(http.StatusConflict, problem.TypeLimitExceeded, "Transaction too large", err.Error()+": nothing was written")
	case errors.Is(err, registry.ErrLimit):
		return problem.New(http.StatusConflict, problem.TypeLimitExceeded, "Registry limit reached", err.Error())
	case errors.Is(err, registry.ErrDatabaseExists), errors.Is(err, registry.ErrKeyChanged), errors.Is(err, registry.ErrFixed), errors.Is(err, registry.ErrContention):
		return problem.New(http.StatusConflict, problem.TypeConflict, "Conflict", err.Error())
	case errors.Is(err, errAvroMulti), errors.Is(err, errLinesMulti), errors.Is(err, ErrNotAcceptable):
		return problem.New(http.StatusNotAcceptable, problem.TypeNotAcceptable, "Not acceptable", err.Error())
	case errors.Is(err, ErrUnsupportedMedia):
		return problem.New(http.StatusUnsupportedMediaType, problem.TypeUnsupportedMedia, "Unsupported media type", err.Error())
	case errors.Is(err, node.ErrOverloaded):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeOverloaded, "Storage overloaded", err.Error()+"; nothing was done: retry after a pause")
		p.RetryAfter = 1
		return p
	case errors.Is(err, node.ErrNotDelivered):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeUnavailable, "Storage unreachable", err.Error()+"; the request was not delivered, nothing was done")
		p.RetryAfter = 1
		return p
	case errors.Is(err, node.ErrUnavailable):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeUnavailable, "Storage unavailable", err.Error()+"; a write's outcome is unknown: read it back or retry it")
		p.RetryAfter = 1
		return p
	case errors.As(err, new(*readError)):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeNotReplicated, "Read not confirmed by replicas", err.Error()+"; what it would return is not yet durable on enough replicas to survive a failover: retry it")
		p.RetryAfter = 1
		return p
	case errors.Is(err, node.ErrNotReplicated):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeNotReplicated, "Write not confirmed by a replica", err.Error()+"; the write may or may not survive a failover: read it back or retry it")
		p.RetryAfter = 1
		return p
	case errors.Is(err, storage.ErrFailed):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeUnavailable, "Storage failed", err.Error()+"; the write was not acknowledged: retry (the partition moves to another node)")
		p.RetryAfter = 1
		return p
	case errors.Is(err, node.ErrNotEnoughReplicas):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeNotEnoughReplicas, "Not enough replicas", err.Error()+"; nothing was written: retry once replicas are back")
		p.RetryAfter = 1
		return p
	case errors.Is(err, node.ErrNotMaster):
		p := problem.New(http.StatusServiceUnavailable, problem.TypeUnavailable, "Partition unavailable", "the partition has no master here right now; retry")
		p.RetryAfter = 1
		return p
	case errors.Is(err, context.DeadlineExceeded):
		return problem.New(http.StatusServiceUnavailable, problem.TypeTimeout, "Deadline exceeded", "the request's deadline passed before it was done")
	case errors.Is(err, context.Canceled):
		return problem.New(499, problem.TypeTimeout, "Request canceled", "")
	}
	return problem.New(http.StatusInternalServerError, problem.TypeInternal, "Internal error", err.Error())
}

// restoreProblem is a restore line's problem: the line's own, its number
// in the detail.
func restoreProblem(le *backup.LineError) *problem.Problem {
	var p *problem.Problem
	var ke *backup.KeyError
	switch {
	case errors.Is(le.Err, backup.ErrMalformed):
		p = problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed restore body", le.Error())
	case errors.As(le.Err, &ke):
		p = problem.New(http.StatusBadRequest, problem.TypeInvalidKey, "Invalid key", le.Error())
	default:
		p = toProblem(le.Err)
		p.Detail = fmt.Sprintf("line %d: %s", le.Line, p.Detail)
	}
	return p
}
