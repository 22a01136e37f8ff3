"""Offline stand-ins for the repositories Bazel 4 would otherwise download.

Bazel 4.2 (Debian's bazel-bootstrap) appends http_archive()s for `rules_cc`, `rules_java`
and `remote_coverage_tools` to every WORKSPACE. Its own @bazel_tools BUILD files load
`@rules_cc//cc:defs.bzl` and `@rules_java//java:defs.bzl`, and every py_test depends on
the C++ toolchain, so without network access the analysis of any py_test fails with
"Unknown host: mirror.bazel.build". This project builds no C++ or Java code: `rules_cc`
and `rules_java` here only forward to Bazel's native rules (which is all the pinned
releases did), and `remote_coverage_tools` exists so that `bazel query 'deps(...)'`
resolves; `bazel coverage` is not supported offline.
"""

_RULES_CC_DEFS = '''\
"""Forwards to Bazel's native C++ rules (offline stand-in for rules_cc)."""

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**attrs)

def fdo_profile(**attrs):
    native.fdo_profile(**attrs)

def objc_import(**attrs):
    native.objc_import(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)
'''

_RULES_CC_BUILD = '''\
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

alias(
    name = "toolchain_type",
    actual = "@bazel_tools//tools/cpp:toolchain_type",
)
'''

_COVERAGE_BUILD = '''\
package(default_visibility = ["//visibility:public"])

# Offline stand-in: `bazel coverage` needs the real remote_coverage_tools.
filegroup(name = "coverage_report_generator", srcs = [])

filegroup(name = "lcov_merger", srcs = [])
'''

def _offline_rules_cc_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "rules_cc")\n')
    rctx.file("BUILD.bazel", "")
    rctx.file("cc/BUILD.bazel", _RULES_CC_BUILD)
    rctx.file("cc/defs.bzl", _RULES_CC_DEFS)

offline_rules_cc = repository_rule(implementation = _offline_rules_cc_impl)

_RULES_JAVA_DEFS = '''\
"""Forwards to Bazel's native Java rules (offline stand-in for rules_java)."""

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_import(**attrs):
    native.java_import(**attrs)

def java_library(**attrs):
    native.java_library(**attrs)

def java_plugin(**attrs):
    native.java_plugin(**attrs)

def java_proto_library(**attrs):
    native.java_proto_library(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_test(**attrs):
    native.java_test(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)
'''

def _offline_rules_java_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "rules_java")\n')
    rctx.file("BUILD.bazel", "")
    rctx.file("java/BUILD.bazel", 'exports_files(["defs.bzl"])\n')
    rctx.file("java/defs.bzl", _RULES_JAVA_DEFS)

offline_rules_java = repository_rule(implementation = _offline_rules_java_impl)

def _offline_coverage_tools_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "remote_coverage_tools")\n')
    rctx.file("BUILD.bazel", _COVERAGE_BUILD)

offline_coverage_tools = repository_rule(implementation = _offline_coverage_tools_impl)
