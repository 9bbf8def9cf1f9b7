// A non-owning reference to a callable, for parameters that are called during the call only.
//
// std::function copies its target and, for lambdas capturing more than two pointers, allocates
// on the heap: the thread pool's ~100 jobs per decode step would be ~100 allocations. FunctionRef
// stores a pointer to the caller's lambda and never allocates; the lambda must outlive the call.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace r3 {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like a function parameter
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace r3
