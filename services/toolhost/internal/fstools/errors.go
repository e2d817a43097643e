package fstools

import (
	"fmt"

	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// The FsErrorCode values of the original harness; results keep {FsError, code}.
const (
	CodeNotFound         = "FS_NOT_FOUND"
	CodeNotDirectory     = "FS_NOT_DIRECTORY"
	CodeNotText          = "FS_NOT_TEXT"
	CodeNotRegularFile   = "FS_NOT_REGULAR_FILE"
	CodePermissionDenied = "FS_PERMISSION_DENIED"
	CodeSandboxDenied    = "FS_SANDBOX_DENIED"
	CodeIOError          = "FS_IO_ERROR"
	CodeStaleVersion     = "FS_STALE_VERSION"
	CodeNotObserved      = "FS_NOT_OBSERVED"
	CodeAmbiguousEdit    = "FS_AMBIGUOUS_EDIT"
	CodeEditNotFound     = "FS_EDIT_NOT_FOUND"
	CodeAborted          = "FS_ABORTED"
)

func fsError(code, format string, args ...any) *toolsdk.Error {
	return toolsdk.NewError("FsError", code, fmt.Sprintf(format, args...), nil)
}
