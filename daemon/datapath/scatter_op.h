// What a read hands its sink per object: where the object's bytes are, to be copied into the
// engine's block. store::ScatterOp is this type.
#ifndef TUTTI_DAEMON_DATAPATH_SCATTER_OP_H_
#define TUTTI_DAEMON_DATAPATH_SCATTER_OP_H_

#include <cstdint>

namespace tutti::datapath {

// One object to copy out of staging (or the DRAM tier) into the engine. `item` indexes the keys
// of the read.
struct ScatterOp {
  uint32_t item;
  uint32_t object;  // layer * parts + part
  const uint8_t* src;
  // `src` is in the DRAM tier (valid until the read returns), else in read staging.
  bool from_dram = false;
  // `src` stays valid until the sink's next call returns (or the read returns, whichever comes
  // first), not only during this call: the sink may leave its copy in flight until then, and
  // must have finished it before returning an error. Otherwise valid only during the call.
  bool stays = false;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_SCATTER_OP_H_
