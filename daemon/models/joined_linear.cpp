// Joined linear layers and their adapters (see joined_linear.hpp).
#include "daemon/models/joined_linear.hpp"

namespace thetad::daemon {

torch::Tensor join_rows(const std::vector<torch::Tensor>& parts) {
  if (parts.size() < 2) return {};
  const torch::Tensor& first = parts.front();
  for (const torch::Tensor& p : parts) {
    if (!p.defined() || !p.is_contiguous() || p.device() != first.device() || p.scalar_type() != first.scalar_type() ||
        p.dim() != first.dim() || p.sizes().slice(1) != first.sizes().slice(1) || p.requires_grad())
      return {};
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : parts) values.push_back(p.detach());
  torch::Tensor joined = torch::cat(values, 0);
  int64_t row = 0;
  for (torch::Tensor p : parts) {  // a handle of the same TensorImpl: set_data reaches every holder
    const int64_t rows = p.size(0);
    p.set_data(joined.narrow(0, row, rows));
    row += rows;
  }
  return joined;
}

bool joined_in(const torch::Tensor& joined, const std::vector<torch::Tensor>& parts) {
  if (!joined.defined()) return false;
  const auto* at = static_cast<const char*>(joined.data_ptr());
  const int64_t bytes = static_cast<int64_t>(joined.element_size());
  for (const torch::Tensor& p : parts) {
    if (!p.defined() || p.device() != joined.device() || p.scalar_type() != joined.scalar_type() ||
        p.data_ptr() != at || !p.is_contiguous())
      return false;
    at += p.numel() * bytes;
  }
  return at == static_cast<const char*>(joined.data_ptr()) + joined.numel() * bytes;
}

torch::Tensor join_lora_a(const std::vector<torch::Tensor>& as) { return as.size() == 1 ? as.front() : torch::cat(as, 1); }

torch::Tensor join_lora_b(const std::vector<torch::Tensor>& bs, const std::vector<int64_t>& outs) {
  const torch::Tensor* some = nullptr;
  int64_t adapted = 0;
  for (const torch::Tensor& b : bs) {
    if (!b.defined()) continue;
    some = some ? some : &b;
    ++adapted;
  }
  if (bs.size() == 1) return bs.front();
  const int64_t n = some->size(0), r = some->size(2);
  // Zeros as a broadcast scalar: cat reads it for each block, nothing of their size is written.
  const torch::Tensor zero = torch::zeros({1, 1, 1}, some->options().requires_grad(false));
  std::vector<torch::Tensor> rows;
  int64_t column = 0;
  for (size_t i = 0; i < bs.size(); ++i) {
    const int64_t out = outs[i];
    if (!bs[i].defined()) {
      rows.push_back(zero.expand({n, out, adapted * r}));
      continue;
    }
    std::vector<torch::Tensor> row;
    if (column > 0) row.push_back(zero.expand({n, out, column * r}));
    row.push_back(bs[i]);
    if (column + 1 < adapted) row.push_back(zero.expand({n, out, (adapted - column - 1) * r}));
    rows.push_back(row.size() == 1 ? row.front() : torch::cat(row, 2));
    ++column;
  }
  return torch::cat(rows, 1);
}

torch::Tensor add_lora(const torch::Tensor& y, const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                       double scale) {
  const int64_t n = a.size(0);
  const torch::Tensor z = torch::bmm(x.reshape({n, -1, x.size(-1)}), a.transpose(1, 2));
  return torch::baddbmm(y.reshape({n, -1, y.size(-1)}), z, b.transpose(1, 2), /*beta=*/1, /*alpha=*/scale).view(y.sizes());
}

}  // namespace thetad::daemon
