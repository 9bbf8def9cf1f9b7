// Assembles a DecoderModel from a DecoderSpec and the checkpoint's tensors, checking every
// tensor's presence and shape against the spec.
#pragma once

#include <memory>

#include "io/checkpoint.h"
#include "models/decoder_model.h"
#include "models/decoder_spec.h"
#include "models/load_options.h"

namespace r3::models {

std::unique_ptr<DecoderModel> build_decoder(const DecoderSpec& spec, const Checkpoint& checkpoint,
                                            const LoadOptions& options = {});

}  // namespace r3::models
