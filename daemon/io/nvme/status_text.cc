#include "daemon/io/nvme/status_text.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "daemon/io/nvme/spec.h"

namespace tutti::io::nvme {
namespace {

const char* StatusName(uint16_t status) {
  switch (status) {
    case kStatusSuccess:
      return "Successful Completion";
    case kStatusInvalidOpcode:
      return "Invalid Command Opcode";
    case kStatusInvalidField:
      return "Invalid Field in Command";
    case kStatusCidConflict:
      return "Command ID Conflict";
    case kStatusDataTransferError:
      return "Data Transfer Error";
    case kStatusPowerLossAbort:
      return "Commands Aborted due to Power Loss Notification";
    case kStatusInternalError:
      return "Internal Error";
    case kStatusAbortRequested:
      return "Command Abort Requested";
    case kStatusSqDeletionAbort:
      return "Command Aborted due to SQ Deletion";
    case kStatusInvalidNamespace:
      return "Invalid Namespace or Format";
    case kStatusCommandSequenceError:
      return "Command Sequence Error";
    case kStatusInvalidSglSegment:
      return "Invalid SGL Segment Descriptor";
    case kStatusDataSglLengthInvalid:
      return "Data SGL Length Invalid";
    case kStatusSglTypeInvalid:
      return "SGL Descriptor Type Invalid";
    case kStatusPrpOffsetInvalid:
      return "PRP Offset Invalid";
    case kStatusLbaOutOfRange:
      return "LBA Out of Range";
    case kStatusCapacityExceeded:
      return "Capacity Exceeded";
    case kStatusNamespaceNotReady:
      return "Namespace Not Ready";
    case kStatusInvalidCqId:
      return "Completion Queue Invalid";
    case kStatusInvalidQueueId:
      return "Invalid Queue Identifier";
    case kStatusInvalidQueueSize:
      return "Invalid Queue Size";
    case kStatusAbortLimitExceeded:
      return "Abort Command Limit Exceeded";
    case kStatusInvalidQueueDeletion:
      return "Invalid Queue Deletion";
    case kStatusWriteFault:
      return "Write Fault";
    case kStatusUnrecoveredRead:
      return "Unrecovered Read Error";
    case kStatusAccessDenied:
      return "Access Denied";
    default:
      return "unknown";
  }
}

}  // namespace

std::string StatusText(uint16_t status) {
  return absl::StrCat("SCT ", StatusSct(status), " SC 0x", absl::Hex(StatusSc(status)), " (",
                      StatusName(status), ")");
}

int StatusToErrno(uint16_t status) {
  switch (status) {
    case kStatusSuccess:
      return 0;
    case kStatusInvalidOpcode:
    case kStatusInvalidField:
    case kStatusLbaOutOfRange:
      return EINVAL;
    case kStatusCapacityExceeded:
      return ENOSPC;
    case kStatusNamespaceNotReady:
      return EAGAIN;
    case kStatusInvalidNamespace:
      return ENXIO;
    case kStatusAccessDenied:
      return EACCES;
    case kStatusAbortRequested:
    case kStatusSqDeletionAbort:
      return ECANCELED;
    default:
      return EIO;
  }
}

}  // namespace tutti::io::nvme
