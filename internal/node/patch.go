package node

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Patch is a partial update, applied to the document's JSON form (see
// schema.JSONWriter) and re-validated against the latest schema:
//
//	{"set": {"a.b": value}, "remove": ["c"], "increment": {"n": 1}}
//
// Paths are dot paths through records and maps; in a segment, `\.` is a
// dot and `\\` a backslash (a map key "example.com" is `sites.example\.com`;
// any other backslash is an error). set replaces the value at
// a path, creating missing intermediate objects. remove drops a map entry,
// or resets a record field to its default (a field without default cannot
// be removed). increment adds a number to an integer or floating-point
// field; a missing field counts from 0. Operations apply in the order
// set, remove, increment.
type Patch struct {
	Set       map[string]any `json:"set,omitempty"`
	Remove    []string       `json:"remove,omitempty"`
	Increment map[string]any `json:"increment,omitempty"`
}

func patchErr(path, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrBadPatch, path, fmt.Sprintf(format, args...))
}

// Empty reports whether the patch changes nothing.
func (p *Patch) Empty() bool {
	return len(p.Set) == 0 && len(p.Remove) == 0 && len(p.Increment) == 0
}

// apply modifies doc, a JSON tree (objects are map[string]any, numbers
// json.Number).
func (p *Patch) apply(doc map[string]any) error {
	for _, path := range sortedKeys(p.Set) {
		parent, last, err := walk(doc, path, true)
		if err != nil {
			return err
		}
		parent[last] = p.Set[path]
	}
	for _, path := range p.Remove {
		parent, last, err := walk(doc, path, false)
		if err != nil {
			return err
		}
		delete(parent, last)
	}
	for _, path := range sortedKeys(p.Increment) {
		parent, last, err := walk(doc, path, true)
		if err != nil {
			return err
		}
		sum, err := add(parent[last], p.Increment[path])
		if err != nil {
			return patchErr(path, "%v", err)
		}
		parent[last] = sum
	}
	return nil
}

// splitPath splits a patch path into its segments at the dots that are
// not escaped, and unescapes them.
func splitPath(path string) ([]string, error) {
	if !pathEscapes(path) {
		return strings.Split(path, "."), nil
	}
	var segs []string
	var seg strings.Builder
	for i := 0; i < len(path); i++ {
		switch c := path[i]; {
		case c == '.':
			segs = append(segs, seg.String())
			seg.Reset()
		case c != '\\':
			seg.WriteByte(c)
		case i+1 < len(path) && (path[i+1] == '.' || path[i+1] == '\\'):
			i++
			seg.WriteByte(path[i])
		default:
			return nil, patchErr(path, "a backslash escapes only a dot or a backslash (at byte %d)", i)
		}
	}
	return append(segs, seg.String()), nil
}

// pathEscapes reports whether path uses escapes (a backslash), which a
// storage node before protocol version 5 would read as part of a key.
func pathEscapes(path string) bool { return strings.Contains(path, `\`) }

// keepsMarks reports whether a write raises auto-increment marks.
func keepsMarks(req WriteRequest) bool {
	return slices.ContainsFunc(req.Ops, func(op Op) bool { return op.Kind == OpKeepMark })
}

// escapes reports whether a write's patches use escaped paths.
func escapes(req WriteRequest) bool {
	for _, op := range req.Ops {
		if op.Patch == nil {
			continue
		}
		for path := range op.Patch.Set {
			if pathEscapes(path) {
				return true
			}
		}
		for path := range op.Patch.Increment {
			if pathEscapes(path) {
				return true
			}
		}
		if slices.ContainsFunc(op.Patch.Remove, pathEscapes) {
			return true
		}
	}
	return false
}

// walk returns the object holding the last segment of path.
func walk(doc map[string]any, path string, create bool) (map[string]any, string, error) {
	if path == "" {
		return nil, "", patchErr(path, "empty path")
	}
	segs, err := splitPath(path)
	if err != nil {
		return nil, "", err
	}
	cur := doc
	for i, s := range segs[:len(segs)-1] {
		next, ok := cur[s]
		if !ok || next == nil {
			if !create {
				return nil, "", patchErr(path, "%s does not exist", strings.Join(segs[:i+1], "."))
			}
			m := map[string]any{}
			cur[s] = m
			cur = m
			continue
		}
		m, ok := next.(map[string]any)
		if !ok {
			return nil, "", patchErr(path, "%s is not an object", strings.Join(segs[:i+1], "."))
		}
		cur = m
	}
	return cur, segs[len(segs)-1], nil
}

// add adds delta to v exactly: integers stay integers (with an overflow
// check), anything with a fraction becomes a float.
func add(v, delta any) (json.Number, error) {
	if v == nil {
		v = json.Number("0")
	}
	a, ok := v.(json.Number)
	if !ok {
		return "", fmt.Errorf("not a number")
	}
	b, ok := delta.(json.Number)
	if !ok {
		return "", fmt.Errorf("increment must be a number")
	}
	ai, aerr := strconv.ParseInt(a.String(), 10, 64)
	bi, berr := strconv.ParseInt(b.String(), 10, 64)
	if aerr == nil && berr == nil {
		s := ai + bi
		if (bi > 0 && s < ai) || (bi < 0 && s > ai) {
			return "", fmt.Errorf("integer overflow")
		}
		return json.Number(strconv.FormatInt(s, 10)), nil
	}
	af, err1 := a.Float64()
	bf, err2 := b.Float64()
	if errors.Is(err2, strconv.ErrRange) {
		return "", fmt.Errorf("increment %s is out of range", b)
	}
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("not a number")
	}
	s := af + bf
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return "", fmt.Errorf("result is not finite")
	}
	return json.Number(strconv.FormatFloat(s, 'g', -1, 64)), nil
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	// Shorter paths first, so setting "a" then "a.b" is deterministic.
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
	})
	return out
}
