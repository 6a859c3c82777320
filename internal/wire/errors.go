package wire

import "github.com/ddstore-go/ddstore/internal/base"

func protoErr(format string, args ...any) error {
	return base.Errorf(base.ErrProtocol, format, args...)
}
