package storeserve

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The MongoDB wire protocol as far as this server reads it: the 16-byte header (messageLength,
// requestID, responseTo, opCode, little-endian int32s) and OP_MSG's flag bits and body section.
const (
	headerLen = 16
	// maxMessage is MongoDB's maxMessageSizeBytes (48 MB), which FerretDB v1 announces too.
	maxMessage = 48 * 1000 * 1000

	opQuery      = 2004
	opCompressed = 2012
	opMsg        = 2013

	flagChecksumPresent = 1 << 0
	flagMoreToCome      = 1 << 1
)

// lockFree are the commands that run without a database lock: the handshake and diagnostics,
// which read no collection (lower-cased).
var lockFree = map[string]bool{
	"hello": true, "ismaster": true, "ping": true, "buildinfo": true, "getparameter": true,
	"hostinfo": true, "whatsmyuri": true, "connectionstatus": true, "getcmdlineopts": true,
	"getlog": true, "serverstatus": true, "saslstart": true, "saslcontinue": true,
	"logout": true, "listcommands": true, "getfreemonitoringstatus": true,
}

// creates are the commands that may create a collection (lower-cased): the server gives its
// table the _id index the first time it sees one of them for a collection.
var creates = map[string]bool{
	"insert": true, "update": true, "findandmodify": true, "create": true, "createindexes": true,
}

// request is what the server needs to know of a client's message.
type request struct {
	requestID  int32
	db, coll   string // $db and the command's collection (its first value, when a string)
	cmd        string // the command's name, lower case ("" for OP_QUERY)
	lockFree   bool
	moreToCome bool
	creates    bool
	// dropDB / dropColl: dropDatabase / drop (the server forgets the tables it indexed).
	dropDB, dropColl bool
	// reply, when set, is answered by this server instead of FerretDB.
	reply bson.D
}

// readMessage reads one whole message.
func readMessage(r io.Reader) ([]byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("read message header: %w", err)
		}
		return nil, err
	}
	n := int32(binary.LittleEndian.Uint32(h[0:4]))
	if n < headerLen || n > maxMessage {
		return nil, fmt.Errorf("message length %d out of range", n)
	}
	msg := make([]byte, n)
	copy(msg, h[:])
	if _, err := io.ReadFull(r, msg[headerLen:]); err != nil {
		return nil, fmt.Errorf("read message of %d bytes: %w", n, err)
	}
	return msg, nil
}

// inspect reads a client's message: which database it locks and whether this server answers
// it. A message this server does not serve (compression, legacy opcodes besides the handshake
// over OP_QUERY) is an error: the connection is closed.
func inspect(msg []byte) (request, error) {
	req := request{requestID: int32(binary.LittleEndian.Uint32(msg[4:8]))}
	switch op := int32(binary.LittleEndian.Uint32(msg[12:16])); op {
	case opMsg:
	case opQuery:
		// The driver's first hello may come as OP_QUERY; FerretDB v1 answers nothing else
		// over it, so it needs no lock.
		req.lockFree = true
		return req, nil
	case opCompressed:
		return req, errors.New("OP_COMPRESSED is not supported (the server offers no compressor)")
	default:
		return req, fmt.Errorf("opcode %d is not supported", op)
	}
	if len(msg) < headerLen+4 {
		return req, errors.New("OP_MSG too short")
	}
	flags := binary.LittleEndian.Uint32(msg[16:20])
	req.moreToCome = flags&flagMoreToCome != 0
	end := len(msg)
	if flags&flagChecksumPresent != 0 {
		end -= 4
	}
	var body bson.Raw
	for p := headerLen + 4; p < end; {
		kind := msg[p]
		p++
		if p+4 > end {
			return req, errors.New("OP_MSG section truncated")
		}
		size := int(int32(binary.LittleEndian.Uint32(msg[p : p+4])))
		if size < 5 || p+size > end {
			return req, errors.New("OP_MSG section size out of range")
		}
		switch kind {
		case 0:
			if body != nil {
				return req, errors.New("OP_MSG has two body sections")
			}
			body = bson.Raw(msg[p : p+size])
		case 1:
		default:
			return req, fmt.Errorf("OP_MSG section kind %d is not supported", kind)
		}
		p += size
	}
	if body == nil {
		return req, errors.New("OP_MSG without a body section")
	}
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return req, fmt.Errorf("OP_MSG body is not a command document: %v", err)
	}
	name := strings.ToLower(elems[0].Key())
	req.cmd = name
	if coll, ok := elems[0].Value().StringValueOK(); ok {
		req.coll = coll
	}
	if db, ok := body.Lookup("$db").StringValueOK(); ok {
		req.db = db
	}
	switch {
	case name == "endsessions":
		// FerretDB v1 has no sessions (it ignores lsid); the driver ends its sessions when it
		// disconnects: nothing to do.
		req.reply = bson.D{{Key: "ok", Value: 1.0}}
		return req, nil
	case name == "committransaction" || name == "aborttransaction" || body.Lookup("startTransaction").Type != 0 || body.Lookup("autocommit").Type != 0:
		req.reply = bson.D{
			{Key: "ok", Value: 0.0},
			{Key: "errmsg", Value: "transactions are not supported by kloud store serve (FerretDB v1): use single-document updates"},
			{Key: "code", Value: int32(20)},
			{Key: "codeName", Value: "IllegalOperation"},
		}
		return req, nil
	}
	req.lockFree = lockFree[name]
	req.creates = creates[name]
	req.dropDB = name == "dropdatabase"
	req.dropColl = name == "drop"
	return req, nil
}

// replyMoreToCome reports whether a reply (OP_MSG) says another follows.
func replyMoreToCome(msg []byte) bool {
	return len(msg) >= headerLen+4 && int32(binary.LittleEndian.Uint32(msg[12:16])) == opMsg &&
		binary.LittleEndian.Uint32(msg[16:20])&flagMoreToCome != 0
}

// replyMsg is an OP_MSG reply (numbered id) to requestID carrying doc.
func replyMsg(id, requestID int32, doc bson.D) []byte {
	raw, err := bson.Marshal(doc)
	if err != nil {
		panic(fmt.Sprintf("storeserve: marshal reply: %v", err)) // our own literal documents
	}
	n := headerLen + 4 + 1 + len(raw)
	out := make([]byte, 0, n)
	out = binary.LittleEndian.AppendUint32(out, uint32(n))
	out = binary.LittleEndian.AppendUint32(out, uint32(id))
	out = binary.LittleEndian.AppendUint32(out, uint32(requestID))
	out = binary.LittleEndian.AppendUint32(out, opMsg)
	out = binary.LittleEndian.AppendUint32(out, 0) // flags
	out = append(out, 0)                           // body section
	return append(out, raw...)
}

// umask sets the process's file mode creation mask and returns the old one.
func umask(m int) int { return syscall.Umask(m) }
