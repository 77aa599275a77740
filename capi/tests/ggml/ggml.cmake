# ggml built from source, and programs linked against it and weightmap's C
# ABI: the one recipe of the ggml proof (capi/tests/ggml/CMakeLists.txt) and
# the decode benchmark (benches/decode/CMakeLists.txt). Configured by
# ggml_build in llama-sources.sh, which passes
#   GGML_SRC       the ggml directory of the pinned llama.cpp
#   WEIGHTMAP_LIB  libweightmap_capi.a (a release build)
# and provides
#   weightmap_ggml_program(TARGET SOURCE...)  a C11 program that includes
#   weightmap.h and links ggml (static, without OpenMP) and weightmap.
if (NOT GGML_SRC)
    message(FATAL_ERROR "set GGML_SRC to ggml's source directory")
endif()
if (NOT WEIGHTMAP_LIB)
    message(FATAL_ERROR "set WEIGHTMAP_LIB to libweightmap_capi.a")
endif()

set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
set(GGML_OPENMP OFF CACHE BOOL "" FORCE)
add_subdirectory(${GGML_SRC} ggml EXCLUDE_FROM_ALL)
find_package(Threads REQUIRED)

set(WEIGHTMAP_INCLUDE_DIR ${CMAKE_CURRENT_LIST_DIR}/../../include)

function(weightmap_ggml_program target)
    add_executable(${target} ${ARGN})
    set_property(TARGET ${target} PROPERTY C_STANDARD 11)
    target_include_directories(${target} PRIVATE ${WEIGHTMAP_INCLUDE_DIR})
    target_link_libraries(${target} PRIVATE ggml ${WEIGHTMAP_LIB} Threads::Threads ${CMAKE_DL_LIBS} m)
endfunction()
