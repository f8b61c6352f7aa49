package replication

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/diskque/diskque/storage"
)

// NodesFileName is the nodes file in the data directory: our id and every
// peer we know, so a node restarted after kill -9 rejoins without MEET. It
// is a cache of the cluster's membership, not state: a damaged one is
// logged and ignored.
//
//	# diskque nodes file ...
//	myself <id> <client ip:port> <bus ip:port> <flags>
//	node <id> <client ip:port> <bus ip:port> <flags>
//	...
//
// flags is "noflags" or a comma list of "fail" and "leaving".
const NodesFileName = "nodes.conf"

// nodesFileMaxSize bounds what is read: a file larger than this is damage.
const nodesFileMaxSize = 4 << 20

type nodesFile struct {
	Self  NodeInfo
	Peers []NodeInfo
}

func (f nodesFile) encode() []byte {
	var b bytes.Buffer
	b.WriteString("# diskque nodes file: written by the server, a cache of the cluster's membership\n")
	line := func(kind string, n NodeInfo) {
		var flags []string
		if n.Failed {
			flags = append(flags, "fail")
		}
		if n.Leaving {
			flags = append(flags, "leaving")
		}
		fl := "noflags"
		if len(flags) > 0 {
			fl = strings.Join(flags, ",")
		}
		client := n.ClientAddr
		if client == "" {
			client = "-"
		}
		fmt.Fprintf(&b, "%s %s %s %s %s\n", kind, n.ID, client, n.BusAddr, fl)
	}
	line("myself", f.Self)
	for _, p := range f.Peers {
		line("node", p)
	}
	return b.Bytes()
}

var errNodesFileDamaged = errors.New("replication: the nodes file is damaged")

func decodeNodesFile(data []byte) (nodesFile, error) {
	var f nodesFile
	if len(data) > nodesFileMaxSize {
		return f, fmt.Errorf("%w: %d bytes", errNodesFileDamaged, len(data))
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<10)
	lineNo, haveSelf := 0, false
	for sc.Scan() {
		lineNo++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		bad := func(why string) error {
			return fmt.Errorf("%w: line %d: %s", errNodesFileDamaged, lineNo, why)
		}
		if len(fields) != 5 {
			return f, bad("not 5 fields")
		}
		n := NodeInfo{ID: fields[1], ClientAddr: fields[2], BusAddr: fields[3]}
		if !storage.ValidNodeID(n.ID) {
			return f, bad("bad node id")
		}
		if n.ClientAddr == "-" {
			n.ClientAddr = ""
		} else if _, _, err := net.SplitHostPort(n.ClientAddr); err != nil {
			return f, bad("bad client address")
		}
		if _, _, err := net.SplitHostPort(n.BusAddr); err != nil {
			return f, bad("bad bus address")
		}
		if fields[4] != "noflags" {
			for _, fl := range strings.Split(fields[4], ",") {
				switch fl {
				case "fail":
					n.Failed = true
				case "leaving":
					n.Leaving = true
				default:
					return f, bad("unknown flag " + fl)
				}
			}
		}
		if seen[n.ID] {
			return f, bad("node listed twice")
		}
		seen[n.ID] = true
		switch fields[0] {
		case "myself":
			if haveSelf {
				return f, bad("two myself lines")
			}
			haveSelf = true
			n.Myself = true
			f.Self = n
		case "node":
			f.Peers = append(f.Peers, n)
		default:
			return f, bad("unknown line kind " + fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return f, fmt.Errorf("%w: %v", errNodesFileDamaged, err)
	}
	if !haveSelf {
		return f, fmt.Errorf("%w: no myself line", errNodesFileDamaged)
	}
	return f, nil
}
