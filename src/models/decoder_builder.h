// Assembles a DecoderModel from a DecoderSpec and the checkpoint's tensors, checking every
// tensor's presence and shape against the spec and recording each in the loader's parameter table.
#pragma once

#include <memory>

#include "models/decoder_model.h"
#include "models/decoder_spec.h"
#include "models/load_options.h"
#include "models/parameter_table.h"

namespace r3::models {

std::unique_ptr<DecoderModel> build_decoder(const DecoderSpec& spec, ParameterLoader& params,
                                            const LoadOptions& options = {});

}  // namespace r3::models
