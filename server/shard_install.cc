// Shard: the model's installation. The first worker to register sends the
// initial weights in chunks (InstallChunk, over server/model_install.h);
// once they are all in, InstallModel sets up the slice's tensors, replica,
// round and optimizer. A restored checkpoint installs through InstallModel
// too.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rejection.h"
#include "common/tensor_codecs.h"
#include "server/shard.h"

namespace pserver {

absl::StatusOr<bool> Shard::InstallChunk(const v1::RegisterRequest& req,
                                         std::vector<TensorSlot> slots) {
  const uint32_t w = req.worker_id();
  const absl::Time now = clock_->Now();
  if (install_ != nullptr && install_->installer() != w) {
    if (install_->Idle(now) < kInstallTimeout) {
      return Reject(v1::REJECT_REASON_BUSY,
                    absl::UnavailableError(absl::StrCat(
                        "worker ", install_->installer(),
                        " is installing the model (", install_->chunks_in(),
                        " of ", install_->plan().num_chunks(),
                        " chunks in); retry")));
    }
    std::fprintf(stderr,
                 "pserver: shard %u: worker %u takes over the model's "
                 "installation from silent worker %u\n",
                 config_.shard_index, w, install_->installer());
    install_.reset();
  }
  if (install_ != nullptr) {
    std::string diff = FirstLayoutDifference(req.layout(), install_->layout());
    if (!diff.empty()) {
      return Reject(v1::REJECT_REASON_LAYOUT_MISMATCH,
                    absl::FailedPreconditionError(absl::StrCat(
                        "model layout differs from the one being installed: ",
                        diff)));
    }
  } else {
    const uint64_t n = ShardRangeFor(TotalElements(req.layout()),
                                     config_.num_shards, config_.shard_index)
                           .size();
    install_ = std::make_unique<ModelInstall>(
        w, req.layout(), std::move(slots), ChunkPlan{n, config_.chunk_elements},
        now);
  }
  install_->Touch(now);
  if (req.has_initial_weights()) {
    if (absl::Status s = install_->Accept(req.weights_chunk(),
                                          req.initial_weights());
        !s.ok()) {
      return s;
    }
  }
  if (!install_->complete()) return false;
  std::unique_ptr<ModelInstall> done = std::move(install_);
  InstallModel(done->layout(), done->slots(), done->TakeWeights());
  return true;
}

void Shard::InstallModel(const v1::ModelLayout& layout,
                         const std::vector<TensorSlot>& slots,
                         std::vector<float> x) {
  ShardRange range = ShardRangeFor(TotalElements(layout), config_.num_shards,
                                   config_.shard_index);
  // Tensor pieces inside this shard, for per-tensor optimizer rules.
  std::vector<LocalSegment> segments;
  std::vector<std::pair<uint64_t, uint64_t>> broadcast;
  for (const TensorSlot& t : slots) {
    uint64_t b = std::max(t.offset, range.begin);
    uint64_t e = std::min(t.offset + t.size, range.end);
    if (b < e) {
      segments.push_back(
          {b - range.begin, e - range.begin, t.group, t.buffer});
    }
    if (b < e && t.broadcast) broadcast.emplace_back(b - range.begin, e - range.begin);
  }
  layout_ = layout;
  slots_ = slots;
  broadcast_ = std::move(broadcast);
  buffers_ = BufferRanges(slots, range);
  pull_plan_phase_ = -1;
  range_ = range;
  x_ = std::move(x);
  replica_->Reset(x_, config_.chunk_elements);
  replica_->UseBufferRanges(buffers_);
  // The slice's tensors (block_topk keeps its blocks in their rows); a
  // schedule's per-tensor pull codecs replace this when a round completes.
  // Buffers travel exactly (fp32) whatever the pull codec.
  replica_->UseTensorCodecs(CodecPlan::ForSlice(
      slots_, range_,
      WithExactBuffers(slots_,
                       std::vector<const Codec*>(slots_.size(), nullptr))));
  // No push can be queued before a model is installed: nothing to answer.
  round_.Resize(range.size(), config_.chunk_elements);
  presence_.Reset(segments);
  optimizer_ = MakeOptimizer(opt_, range.size(),
                             std::move(segments), pool_);
  registered_ = true;
  ++arrays_version_;
  // Every worker's lease starts now: the first rounds wait for all of them.
  leases_.RenewAll();
  PublishLiveness();
  metrics_->SetModelElements(range.size());
  metrics_->SetStage(optimizer_->stage());
  PublishLearningRates(RoundHyper().For(step_, config_.optimizer, layout_));
}

void Shard::PublishLearningRates(const std::vector<GroupHyper>& hyper) {
  for (size_t g = 0; g < hyper.size(); ++g) {
    metrics_->SetLearningRate(static_cast<uint32_t>(g), hyper[g].lr);
  }
}

}  // namespace pserver
