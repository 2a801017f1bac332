// The C++ wrapper from an installed package (find_package(kvfence)).
#include <kvfence.hpp>
#include <cstdio>

int main() {
    kvfence::Table t = kvfence::Table::create(kvfence::Table::gate(64)).value();
    const uint32_t ranks[] = {0, 1}, pages[] = {3, 4};
    kvfence::Handle h = t.open_gate(ranks, 2, 1, pages, 2).value();
    {
        kvfence::TransferGuard g = t.begin(h, 0).value();
        (void)g.complete().value();
    }
    auto a = t.abort(h).value();
    for (size_t i = 0; i < a.fanout_size(); i++) (void)t.quiesce(h, a.fanout()[i]);
    std::printf("cpp consumer: phase %u\n", (unsigned)t.phase(h).value());
    return t.phase(h).value() == KVFENCE_PHASE_FREE ? 0 : 1;
}
