# CMake package config for kvfence (installed by ffi/install.sh into
# <prefix>/lib/cmake/kvfence/). Relocatable: paths are computed from this file's place.
#
#   find_package(kvfence 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE kvfence::kvfence)         # libkvfence.so.0
#   target_link_libraries(app PRIVATE kvfence::kvfence_static)  # libkvfence.a
include(CMakeFindDependencyMacro)
find_dependency(Threads)

get_filename_component(_kvfence_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET kvfence::kvfence)
    add_library(kvfence::kvfence SHARED IMPORTED)
    set_target_properties(kvfence::kvfence PROPERTIES
        IMPORTED_LOCATION "${_kvfence_prefix}/lib/libkvfence.so.@VERSION@"
        IMPORTED_SONAME "libkvfence.so.0"
        INTERFACE_INCLUDE_DIRECTORIES "${_kvfence_prefix}/include")
endif()
if(NOT TARGET kvfence::kvfence_static)
    add_library(kvfence::kvfence_static STATIC IMPORTED)
    set_target_properties(kvfence::kvfence_static PROPERTIES
        IMPORTED_LOCATION "${_kvfence_prefix}/lib/libkvfence.a"
        INTERFACE_INCLUDE_DIRECTORIES "${_kvfence_prefix}/include"
        # The Rust standard library's needs (rustc --print native-static-libs).
        # (without gcc_s: the compiler driver links libgcc itself, static or shared).
        INTERFACE_LINK_LIBRARIES "Threads::Threads;util;rt;m;dl")
endif()

set(kvfence_INCLUDE_DIRS "${_kvfence_prefix}/include")
set(kvfence_LIBRARIES kvfence::kvfence)
unset(_kvfence_prefix)
