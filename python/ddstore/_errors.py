"""Exceptions of ddstore. Each maps one sentinel error of the Go side (its
wire status code) and also derives from the builtin a Python user expects:
IndexError for indices, ValueError for shapes and dtypes, KeyError for unknown
variables, TimeoutError and ConnectionError for peers and agents,
PermissionError for a refused key.

Errors only the Python side raises (the torch layer, the sampler, pyddstore)
are subclasses of these, so that `except ddstore.Error` catches every error
of the package; where PyTorch or DDStore raise another builtin for the same
mistake (TypeError, KeyError, RuntimeError, NotImplementedError), the
subclass derives from that builtin too."""

import builtins


class Error(Exception):
    """Base of every ddstore error."""

    code = 13

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class IndexOutOfRange(Error, builtins.IndexError):
    code = 1


class GeometryError(Error, builtins.ValueError):
    code = 2


class UnknownVariable(Error, builtins.KeyError):
    code = 3


class VariableExists(Error, builtins.ValueError):
    code = 4


class BadBuffer(Error, builtins.ValueError):
    code = 5


class FreedVariable(Error, builtins.KeyError):
    code = 6


class ClosedError(Error, builtins.ValueError):
    code = 7


class Timeout(Error, builtins.TimeoutError):
    code = 8


class PeerError(Error, builtins.ConnectionError):
    code = 9


class ProtocolError(Error, builtins.ConnectionError):
    code = 10


class NoAgent(Error, builtins.ConnectionError):
    code = 11


class ArgumentError(Error, builtins.ValueError):
    code = 12


class InternalError(Error, builtins.RuntimeError):
    code = 13


class AuthError(Error, builtins.PermissionError):
    """A connection that did not prove it belongs to the job (DDSTORE_SECRET,
    or the agent's key file)."""
    code = 14


class RegionLost(ArgumentError):
    """A read into a receive buffer its agent does not hold (the session
    that registered it ended, or the agent was restarted); the store
    registers its buffers again and reads once more before raising it."""
    code = 15


class ArgumentTypeError(ArgumentError, builtins.TypeError):
    """An argument of the wrong type (PyTorch and numpy raise TypeError)."""


class UnknownField(ArgumentError, builtins.KeyError):
    """A field key a dataset's samples do not have."""


class Unsupported(ArgumentError, builtins.NotImplementedError):
    """A combination of DDStore's arguments this implementation does not
    offer (DDStore raises NotImplementedError)."""


class BadDataset(GeometryError):
    """A dataset in the store that is not what the torch layer publishes:
    metadata of another format, or variables of unequal rows."""


class LoaderTimeout(Timeout, builtins.RuntimeError):
    """A loader batch not ready within the loader's timeout (PyTorch's
    DataLoader raises RuntimeError)."""


_BY_CODE = {c.code: c for c in (IndexOutOfRange, GeometryError, UnknownVariable, VariableExists, BadBuffer,
                                 FreedVariable, ClosedError, Timeout, PeerError, ProtocolError, NoAgent,
                                 ArgumentError, InternalError, AuthError, RegionLost)}


def from_status(code, message):
    """The exception for a reply's status code and message."""
    return _BY_CODE.get(code, InternalError)(message)


# Exit statuses of the `ddstore` command (docs/protocol.md, "Exit statuses of
# the ddstore command"; the vectors' exit_codes pin them): a program that
# runs it tells what failed from the status, never from its stderr.
EXIT_USAGE = 2  # a flag the binary does not take: a binary older than this package, when the package built the command
EXIT_AGENT_RUNS = 3  # `ddstore agent`: another agent of the namespace and node runs (an ErrExists)
EXIT_KIND = 64  # + the status code of the error's sentinel


def from_exit(status, message):
    """The exception for a nonzero exit status of `ddstore` and the message
    to carry (its stderr, say): the sentinel's class for EXIT_KIND + code,
    VariableExists for EXIT_AGENT_RUNS, else (usage, a signal, a status of
    another build) an InternalError."""
    if status == EXIT_AGENT_RUNS:
        return VariableExists(message)
    if status > EXIT_KIND and status - EXIT_KIND in _BY_CODE:
        return from_status(status - EXIT_KIND, message)
    return InternalError(message)
