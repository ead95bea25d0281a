#include "zero/grad_finish.h"

#include <cmath>

namespace zero3d {

double clip_coefficient(double max_norm, double grad_norm) {
  if (!(max_norm > 0.0)) return 1.0;
  const double coef = max_norm / (grad_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

void GradFinisher::reduce() {
  engine_.finish_gradients();
  if (groups_.topo.pp > 1 && groups_.embedding && engine_.has_tied_embedding()) {  // every rank or none: the config
    auto [g, n] = engine_.tied_embedding_grad();
    be_.synchronize();
    groups_.embedding->all_reduce_sum(be_.mem(g), n);
  }
}

double GradFinisher::global_norm(double loss_scale) {
  return std::sqrt(groups_.pp->all_reduce_sum(groups_.tp->all_reduce_sum(engine_.grad_norm_sq()))) / loss_scale;
}

void GradFinisher::unscale_and_clip(double max_norm, double grad_norm, double loss_scale) {
  const double factor = clip_coefficient(max_norm, grad_norm) / loss_scale;
  if (factor != 1.0) engine_.scale_grads(static_cast<float>(factor));
}

}  // namespace zero3d
