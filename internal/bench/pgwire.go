package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"
)

// pgConn is the least of PostgreSQL's frontend protocol a benchmark needs
// to know when each of its inserts was acknowledged (pgbench reports
// latencies, not which row each transaction wrote): a startup with trust
// authentication, and simple queries.
type pgConn struct {
	c net.Conn
	r *bufio.Reader
}

// maxPGMessage bounds one message from the server.
const maxPGMessage = 1 << 20

func dialPG(addr, user, db string) (*pgConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	p := &pgConn{c: c, r: bufio.NewReader(c)}
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, 3<<16) // protocol 3.0
	for _, s := range []string{"user", user, "database", db} {
		b = append(append(b, s...), 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	if _, err := c.Write(b); err != nil {
		c.Close()
		return nil, err
	}
	if err := p.ready(); err != nil {
		c.Close()
		return nil, err
	}
	return p, nil
}

// ready reads messages until ReadyForQuery, returning the first error
// the server sent.
func (p *pgConn) ready() error {
	var first error
	for {
		typ, body, err := p.read()
		if err != nil {
			return err
		}
		switch typ {
		case 'Z':
			return first
		case 'E':
			if first == nil {
				first = fmt.Errorf("postgres: %q", body)
			}
		case 'R':
			if len(body) < 4 || binary.BigEndian.Uint32(body) != 0 {
				return errors.New("postgres: asks for a password; the benchmark's server trusts local connections")
			}
		}
	}
}

func (p *pgConn) read() (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(p.r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(h[1:])) - 4
	if n < 0 || n > maxPGMessage {
		return 0, nil, fmt.Errorf("postgres: a message of %d bytes", n)
	}
	body := make([]byte, n)
	_, err := io.ReadFull(p.r, body)
	return h[0], body, err
}

// exec runs one simple query and waits for its end.
func (p *pgConn) exec(sql string) error {
	b := append([]byte{'Q', 0, 0, 0, 0}, sql...)
	b = append(b, 0)
	binary.BigEndian.PutUint32(b[1:], uint32(len(b)-1))
	if _, err := p.c.Write(b); err != nil {
		return err
	}
	return p.ready()
}

func (p *pgConn) Close() error { return p.c.Close() }

// AckLagPostgres is AckLag for PostgreSQL: inserts into table docs (id,
// doc) at addr (trust authentication, user postgres) at rate a second for
// duration over conns connections, while pg_recvlogical reads the
// wal2json slot, and measures from each insert's acknowledgement to its
// row's receipt.
func AckLagPostgres(ctx context.Context, addr, slot string, first int, rate float64, duration time.Duration, conns, docBytes int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if docBytes <= 0 {
		docBytes = 1024
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	ackAt, seenAt := map[int]time.Time{}, map[int]time.Time{}
	cmd := exec.CommandContext(ctx, "pg_recvlogical", "-h", host, "-p", port, "-U", "postgres", "-d", "postgres",
		"--slot", slot, "--start", "-o", "format-version=2", "-o", "include-transaction=0", "-f", "-")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait(); cmd.Wait() }()
	wg.Go(func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			var m struct {
				Action  string `json:"action"`
				Columns []struct {
					Name  string          `json:"name"`
					Value json.RawMessage `json:"value"`
				} `json:"columns"`
			}
			now := time.Now()
			if json.Unmarshal(sc.Bytes(), &m) != nil || m.Action != "I" {
				continue
			}
			for _, c := range m.Columns {
				if id, err := strconv.Atoi(string(c.Value)); c.Name == "id" && err == nil {
					mu.Lock()
					seenAt[id] = now
					mu.Unlock()
				}
			}
		}
	})
	pool := make(chan *pgConn, conns)
	for range conns {
		c, err := dialPG(addr, "postgres", "postgres")
		if err != nil {
			return "", err
		}
		defer c.Close()
		pool <- c
	}
	time.Sleep(time.Second) // pg_recvlogical is streaming
	failed := 0
	var inserts sync.WaitGroup
	perr := paced(ctx, rate, duration, func(i int) {
		c := <-pool
		inserts.Go(func() {
			defer func() { pool <- c }()
			id := first + i
			err := c.exec(fmt.Sprintf("INSERT INTO docs VALUES (%d, jsonb_build_object('n', %d, 'payload', repeat('x', %d)))", id, id, docBytes))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			ackAt[id] = time.Now()
		})
	})
	inserts.Wait()
	if perr != nil {
		return "", perr
	}
	awaitStragglers(&mu, ackAt, seenAt)
	mu.Lock()
	defer mu.Unlock()
	res, err := ackLags(ackAt, seenAt)
	if err == nil && failed > 0 {
		err = fmt.Errorf("%d inserts failed", failed)
	}
	return res, err
}

// awaitStragglers waits until every acknowledged insert was seen on the
// stream, or 5 s.
func awaitStragglers(mu *sync.Mutex, ackAt, seenAt map[int]time.Time) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		all := len(seenAt) >= len(ackAt)
		mu.Unlock()
		if all {
			return
		}
	}
}

// ackLags summarizes, over the acknowledged ids that were seen, the time
// from acknowledgement to receipt (0 when the receipt came first).
func ackLags(ackAt, seenAt map[int]time.Time) (string, error) {
	var lags []time.Duration
	early := 0
	for id, at := range ackAt {
		seen, ok := seenAt[id]
		if !ok {
			continue
		}
		if d := seen.Sub(at); d > 0 {
			lags = append(lags, d)
		} else {
			lags = append(lags, 0)
			early++
		}
	}
	if len(lags) == 0 {
		return "", fmt.Errorf("no acknowledged insert was seen on the stream (%d acknowledged)", len(ackAt))
	}
	slices.Sort(lags)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return fmt.Sprintf("acked %d seen %d before_ack %d ack_to_receipt_p50_ms %.2f p99_ms %.2f max_ms %.2f",
		len(ackAt), len(lags), early, ms(lags[len(lags)/2]), ms(lags[len(lags)*99/100]), ms(lags[len(lags)-1])), nil
}
