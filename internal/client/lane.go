package client

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddstore-go/ddstore/internal/auth"
	"github.com/ddstore-go/ddstore/internal/base"
	"github.com/ddstore-go/ddstore/internal/shm"
	"github.com/ddstore-go/ddstore/internal/wire"
)

// lane is one connection to the node's agent with its own staging region
// for rows from other nodes. A Store keeps a pool of lanes so that
// goroutines reading at once do not queue behind each other.
type lane struct {
	conn    *net.UnixConn
	out, in []byte
	id      uint64
	stage   *shm.Region
	stageID uint32
	read    wire.Read
	broken  bool
	// unsent: the lane broke writing a request, which so never reached
	// the agent (safe to send again on another lane).
	unsent bool
}

func dialLane(socket string, hello *wire.Hello, timeout time.Duration) (*lane, *wire.HelloReply, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: connect to %s: %w", base.ErrNoAgent, socket, err)
	}
	if err := authenticate(c, socket, timeout); err != nil {
		c.Close()
		return nil, nil, err
	}
	l := &lane{conn: c, id: auth.FirstID - 1}
	body, err := l.call(wire.OpHello, hello.Encode, timeout)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	r, err := wire.DecodeHelloReply(body)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return l, &r, nil
}

// authenticate proves to the agent at socket that this client belongs to
// the job: the key of DDSTORE_SECRET, else the agent's key file.
func authenticate(c *net.UnixConn, socket string, timeout time.Duration) error {
	k, from, err := auth.ClientKey(socket)
	if err != nil {
		return fmt.Errorf("agent at %s: %w", socket, err)
	}
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	err = auth.Initiate(c, k, auth.Client)
	var ne net.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, base.ErrAuth):
		return fmt.Errorf("agent at %s, with the key of %s: %w", socket, from, err)
	case errors.Is(err, base.ErrProtocol):
		return err
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: the agent at %s did not complete authentication in time: %w", base.ErrTimeout, socket, err)
	default:
		return fmt.Errorf("%w: authenticating to %s: %w", base.ErrNoAgent, socket, err)
	}
}

// call sends one request and waits for its reply; a transport failure
// breaks the lane (the Store drops it and dials a new one next time).
func (l *lane) call(op wire.Op, fill func(*wire.Encoder), timeout time.Duration) ([]byte, error) {
	return l.callFd(op, fill, -1, timeout)
}

func (l *lane) callFd(op wire.Op, fill func(*wire.Encoder), fd int, timeout time.Duration) ([]byte, error) {
	l.id++
	l.out = wire.AppendFrame(l.out[:0], op, 0, l.id, 0, fill)
	l.conn.SetDeadline(time.Now().Add(timeout))
	var err error
	if fd >= 0 {
		_, _, err = l.conn.WriteMsgUnix(l.out, unix.UnixRights(fd), nil)
	} else {
		_, err = l.conn.Write(l.out)
	}
	if err != nil {
		l.unsent = true
		return nil, l.fail(op, err)
	}
	h, body, err := wire.ReadFrame(l.conn, l.in)
	l.in = body[:0]
	if err != nil {
		return nil, l.fail(op, err)
	}
	if h.ID != l.id || h.Op != op || h.Payload != 0 {
		return nil, l.fail(op, base.Errorf(base.ErrProtocol, "reply %s #%d to request %s #%d", h.Op, h.ID, op, l.id))
	}
	if err := wire.StatusError(h, body); err != nil {
		return nil, err
	}
	return body, nil
}

func (l *lane) fail(op wire.Op, err error) error {
	l.broken = true
	l.conn.Close()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w: the agent did not answer %s in time: %w", base.ErrTimeout, op, err)
	}
	if errors.Is(err, base.ErrProtocol) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", base.ErrNoAgent, op, err)
}

// register hands a shared-memory region to the agent.
func (l *lane) register(r *shm.Region, timeout time.Duration) (uint32, error) {
	m := wire.Region{Size: int64(len(r.Mem))}
	body, err := l.callFd(wire.OpRegister, m.Encode, r.Fd, timeout)
	if err != nil {
		return 0, err
	}
	reply, err := wire.DecodeRegion(body)
	return reply.ID, err
}

// staging returns a registered region of at least n bytes, growing the
// lane's own when needed.
func (l *lane) staging(n int, timeout time.Duration) ([]byte, uint32, error) {
	if l.stage != nil && len(l.stage.Mem) >= n {
		return l.stage.Mem, l.stageID, nil
	}
	size := max(n, 1<<20)
	if l.stage != nil {
		size = max(size, 2*len(l.stage.Mem))
		m := wire.Region{ID: l.stageID}
		if _, err := l.call(wire.OpUnregister, m.Encode, timeout); err != nil {
			return nil, 0, err
		}
		l.stage.Close()
		l.stage = nil
	}
	r, err := shm.NewRegion(fmt.Sprintf("ddstore-recv-%d", os.Getpid()), size)
	if err != nil {
		return nil, 0, err
	}
	id, err := l.register(r, timeout)
	if err != nil {
		r.Close()
		return nil, 0, err
	}
	l.stage, l.stageID = r, id
	return r.Mem, id, nil
}

func (l *lane) close() {
	l.conn.Close()
	if l.stage != nil {
		l.stage.Close()
		l.stage = nil
	}
}
