package schema

import "fmt"

// FieldError says which field of a document or schema is at fault. Path is a
// dot path from the document root ("" for the root itself).
type FieldError struct {
	Path   string
	Reason string
	cause  error
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Reason
	}
	return fmt.Sprintf("field %s: %s", e.Path, e.Reason)
}

// maxPathEcho bounds how much of a field path an error repeats: a path
// into a deeply nested document is cut to its last part.
const maxPathEcho = 120

func fieldErr(path, format string, args ...any) *FieldError {
	if len(path) > maxPathEcho {
		path = "…" + path[len(path)-maxPathEcho:]
	}
	fe := &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if err, ok := a.(error); ok {
			fe.cause = err
		}
	}
	return fe
}

// Unwrap returns the decoding error behind a field error, if any.
func (e *FieldError) Unwrap() error { return e.cause }

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
