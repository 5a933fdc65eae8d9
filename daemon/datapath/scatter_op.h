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
  // `src` is in the DRAM tier and stays valid until the read returns (not only during the sink's
  // call): the sink may leave its copy in flight until a later layer. Otherwise `src` is in
  // staging, valid only during the sink's call.
  bool from_dram = false;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_SCATTER_OP_H_
