# The Kubernetes test double's own checks and its fidelity to real clients
# (issue 17 point 7), included by tests/kubernetes/CMakeLists.txt. Each test
# starts its own double through scripts/kube-server.sh on a free loopback
# port in its own temp dir, and stops it on exit. kubectl (Debian's
# kubernetes-client) and python3-kubernetes are required: missing, the
# tests FAIL with a message saying what to install, they never skip.

# The double's protocol: resourceVersion semantics, 201/404/409/422/400,
# 401/403, Date, watch and 410, list selectors and pages, the fault hooks.
add_test(NAME kube_double
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/kube_double.py
          ${PROJECT_SOURCE_DIR}/scripts/kube-server.sh)
set_tests_properties(kube_double PROPERTIES TIMEOUT 120 LABELS "kubernetes")

# kubectl get/apply/delete of Lease objects on the double, and what
# `lease acquire` wrote as kubectl shows it.
add_test(NAME kube_kubectl
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/kube_kubectl.sh $<TARGET_FILE:lease_cli>)
set_tests_properties(kube_kubectl PROPERTIES TIMEOUT 240 LABELS "kubernetes")

# `lease elect` against a client-go style leader (python3-kubernetes'
# CoordinationV1Api) on one Lease: one leader at a time, takeover after the
# other stops, both ways.
add_test(NAME kube_interop
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/kube_interop.sh $<TARGET_FILE:lease_cli>)
set_tests_properties(kube_interop PROPERTIES TIMEOUT 240 LABELS "kubernetes")
