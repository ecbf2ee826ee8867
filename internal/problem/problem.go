// Package problem owns Cortado's error responses: RFC 9457
// application/problem+json bodies with a stable type URI per kind of
// failure. Types never change once published; clients branch on them.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ContentType is the media type of a problem body.
const ContentType = "application/problem+json"

// Stable problem types.
const (
	TypeMalformed          = "urn:cortado:problem:malformed-request"
	TypeInvalidDocument    = "urn:cortado:problem:invalid-document"
	TypeInvalidKey         = "urn:cortado:problem:invalid-key"
	TypeInvalidProjection  = "urn:cortado:problem:invalid-projection"
	TypeInvalidSchema      = "urn:cortado:problem:invalid-schema"
	TypeIncompatibleSchema = "urn:cortado:problem:incompatible-schema"
	TypeNoDatabase         = "urn:cortado:problem:no-such-database"
	TypeNoTable            = "urn:cortado:problem:no-such-table"
	TypeNoVersion          = "urn:cortado:problem:no-such-schema-version"
	TypeNotFound           = "urn:cortado:problem:document-not-found"
	TypeConflict           = "urn:cortado:problem:conflict"
	TypePrecondition       = "urn:cortado:problem:precondition-failed"
	TypeBodyTooLarge       = "urn:cortado:problem:request-too-large"
	TypeHeadersTooLarge    = "urn:cortado:problem:headers-too-large"
	TypeResponseTooLarge   = "urn:cortado:problem:response-too-large"
	TypeNotAcceptable      = "urn:cortado:problem:not-acceptable"
	TypeUnsupportedMedia   = "urn:cortado:problem:unsupported-media-type"
	TypeMethodNotAllowed   = "urn:cortado:problem:method-not-allowed"
	TypeUnavailable        = "urn:cortado:problem:unavailable"
	TypeNotReplicated      = "urn:cortado:problem:not-replicated"
	TypeNotEnoughReplicas  = "urn:cortado:problem:not-enough-replicas"
	TypeTimeout            = "urn:cortado:problem:deadline-exceeded"
	TypeRequestTimeout     = "urn:cortado:problem:request-timeout"
	TypeInternal           = "urn:cortado:problem:internal"
	TypeInvalidToken       = "urn:cortado:problem:invalid-token"
	TypeInvalidQuery       = "urn:cortado:problem:invalid-query"
	TypeIndexBuilding      = "urn:cortado:problem:index-building"
	TypeOverloaded         = "urn:cortado:problem:overloaded"
	TypeQuotaExceeded      = "urn:cortado:problem:quota-exceeded"
	TypeLimitExceeded      = "urn:cortado:problem:limit-exceeded"
)

// Problem is an RFC 9457 problem detail, with Cortado's extension members.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Field is the dot path of the offending document or schema field.
	Field string `json:"field,omitempty"`
	// Operation is the index of the failing operation of a transaction.
	Operation *int `json:"operation,omitempty"`
	// Position is the byte offset in a query where it went wrong.
	Position *int `json:"position,omitempty"`
	// RetryAfter, in seconds, is also sent as the Retry-After header.
	RetryAfter int `json:"-"`
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Title + ": " + p.Detail
	}
	return p.Title
}

// MaxDetail bounds a problem's detail: details may quote input, and an
// error must never echo a large part of a request back.
const MaxDetail = 512

// New returns a problem of a type with its status and title.
func New(status int, typ, title, detail string) *Problem {
	if len(detail) > MaxDetail {
		cut := MaxDetail
		for cut > 0 && detail[cut]&0xC0 == 0x80 { // not inside a UTF-8 sequence
			cut--
		}
		detail = detail[:cut] + "…"
	}
	return &Problem{Type: typ, Title: title, Status: status, Detail: detail}
}

// Write sends p.
func Write(w http.ResponseWriter, p *Problem) {
	body, _ := json.Marshal(p)
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	w.Write(body)
}
