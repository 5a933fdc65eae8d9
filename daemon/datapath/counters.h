// What the read side of the data path did, counted since start: for stats and the operations
// export. Thread-safe (relaxed atomics; a snapshot is not one instant across fields).
#ifndef TUTTI_DAEMON_DATAPATH_COUNTERS_H_
#define TUTTI_DAEMON_DATAPATH_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace tutti::datapath {

// Batches of reads and their time by phase, in nanoseconds (ReadCountersSnapshot::batch_*).
struct BatchPhases {
  uint64_t batches = 0, slot_ns = 0, io_ns = 0, check_ns = 0, release_ns = 0;
  BatchPhases& operator+=(const BatchPhases& o) {
    batches += o.batches;
    slot_ns += o.slot_ns;
    io_ns += o.io_ns;
    check_ns += o.check_ns;
    release_ns += o.release_ns;
    return *this;
  }
};

struct ReadCountersSnapshot {
  uint64_t ios = 0;            // pool reads posted
  uint64_t io_bytes = 0;       // bytes those reads asked for
  uint64_t objects = 0;        // objects they carried (objects / ios: objects merged per I/O)
  uint64_t merged_ios = 0;     // reads that carried more than one object
  uint64_t staging_waits = 0;  // reads that waited for staging to be given back
  uint64_t staging_yields = 0;  // leases a read gave back early, another read waiting
  // Where the threads leading reads spent their time, in nanoseconds: waiting for a layer's reads
  // and checks to be done, and in the sink (handing the layer to the engine), over `layers`
  // layers. wait >> sink: the devices or the checks are the limit; sink >> wait: the engine copy.
  uint64_t lead_wait_ns = 0;
  uint64_t lead_sink_ns = 0;
  uint64_t lead_post_ns = 0;  // planning and posting layers' reads
  uint64_t layers = 0;
  // Where a layer's batches of reads (one device each) spent their time, in nanoseconds summed
  // over `batches`: waiting for a bounce slot (GPU staging only; 0 otherwise), from their post to
  // the scheduler until their reads completed (its queue and the device's), and from there until
  // the verifier answered (its queue, the copies and the checks). What makes a layer wait.
  uint64_t batches = 0;
  uint64_t batch_slot_ns = 0;
  uint64_t batch_io_ns = 0;
  uint64_t batch_check_ns = 0;
  // Of batch_check_ns, with bounce slots: from the reads' completion until the verifier gave the
  // batch's slot back (the GPU's: its copy to the GPU landed); 0 without bounce slots.
  uint64_t batch_release_ns = 0;
  // Read calls, and their time from entry (staging taken included) to return.
  uint64_t calls = 0;
  uint64_t call_ns = 0;

  ReadCountersSnapshot& operator+=(const ReadCountersSnapshot& o) {
    ios += o.ios;
    io_bytes += o.io_bytes;
    objects += o.objects;
    merged_ios += o.merged_ios;
    staging_waits += o.staging_waits;
    staging_yields += o.staging_yields;
    lead_wait_ns += o.lead_wait_ns;
    lead_sink_ns += o.lead_sink_ns;
    lead_post_ns += o.lead_post_ns;
    layers += o.layers;
    batches += o.batches;
    batch_slot_ns += o.batch_slot_ns;
    batch_io_ns += o.batch_io_ns;
    batch_check_ns += o.batch_check_ns;
    batch_release_ns += o.batch_release_ns;
    calls += o.calls;
    call_ns += o.call_ns;
    return *this;
  }
};

class ReadCounters {
 public:
  void AddLayer(uint64_t ios, uint64_t bytes, uint64_t objects, uint64_t merged) {
    ios_.fetch_add(ios, std::memory_order_relaxed);
    io_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    objects_.fetch_add(objects, std::memory_order_relaxed);
    merged_ios_.fetch_add(merged, std::memory_order_relaxed);
  }
  void AddStagingWait() { staging_waits_.fetch_add(1, std::memory_order_relaxed); }
  void AddStagingYield() { staging_yields_.fetch_add(1, std::memory_order_relaxed); }
  void AddLead(uint64_t wait_ns, uint64_t sink_ns) {
    lead_wait_ns_.fetch_add(wait_ns, std::memory_order_relaxed);
    lead_sink_ns_.fetch_add(sink_ns, std::memory_order_relaxed);
    layers_.fetch_add(1, std::memory_order_relaxed);
  }

  void AddBatches(const BatchPhases& p) {
    batches_.fetch_add(p.batches, std::memory_order_relaxed);
    batch_slot_ns_.fetch_add(p.slot_ns, std::memory_order_relaxed);
    batch_io_ns_.fetch_add(p.io_ns, std::memory_order_relaxed);
    batch_check_ns_.fetch_add(p.check_ns, std::memory_order_relaxed);
    batch_release_ns_.fetch_add(p.release_ns, std::memory_order_relaxed);
  }
  void AddPost(uint64_t ns) { lead_post_ns_.fetch_add(ns, std::memory_order_relaxed); }
  void AddCall(uint64_t ns) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    call_ns_.fetch_add(ns, std::memory_order_relaxed);
  }

  ReadCountersSnapshot Snapshot() const {
    ReadCountersSnapshot s;
    s.ios = ios_.load(std::memory_order_relaxed);
    s.io_bytes = io_bytes_.load(std::memory_order_relaxed);
    s.objects = objects_.load(std::memory_order_relaxed);
    s.merged_ios = merged_ios_.load(std::memory_order_relaxed);
    s.staging_waits = staging_waits_.load(std::memory_order_relaxed);
    s.staging_yields = staging_yields_.load(std::memory_order_relaxed);
    s.lead_wait_ns = lead_wait_ns_.load(std::memory_order_relaxed);
    s.lead_sink_ns = lead_sink_ns_.load(std::memory_order_relaxed);
    s.lead_post_ns = lead_post_ns_.load(std::memory_order_relaxed);
    s.layers = layers_.load(std::memory_order_relaxed);
    s.batches = batches_.load(std::memory_order_relaxed);
    s.batch_slot_ns = batch_slot_ns_.load(std::memory_order_relaxed);
    s.batch_io_ns = batch_io_ns_.load(std::memory_order_relaxed);
    s.batch_check_ns = batch_check_ns_.load(std::memory_order_relaxed);
    s.batch_release_ns = batch_release_ns_.load(std::memory_order_relaxed);
    s.calls = calls_.load(std::memory_order_relaxed);
    s.call_ns = call_ns_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::atomic<uint64_t> ios_{0}, io_bytes_{0}, objects_{0}, merged_ios_{0}, staging_waits_{0},
      staging_yields_{0};
  std::atomic<uint64_t> lead_wait_ns_{0}, lead_sink_ns_{0}, lead_post_ns_{0}, layers_{0}, calls_{0},
      call_ns_{0};
  std::atomic<uint64_t> batches_{0}, batch_slot_ns_{0}, batch_io_ns_{0}, batch_check_ns_{0},
      batch_release_ns_{0};
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_COUNTERS_H_
